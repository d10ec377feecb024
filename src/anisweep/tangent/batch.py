"""The loss batch of the gradient analysis: masked-LM targets for encoders, next-token targets for decoders,
and the tokens' frequency strata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


# --------------------------------------------------------------------------- the loss and its targets
@dataclass
class LMBatch:
    """What the model reads (`input_ids`, with [MASK]s for an encoder) and what the loss predicts."""

    input_ids: torch.Tensor  # (N, T)
    valid: torch.Tensor  # (N, T) bool
    labels: torch.Tensor  # (N, T), -100 where no target; for a decoder, the NEXT token
    token_ids: torch.Tensor  # (N, T) the evaluation batch's own tokens (the strata's ids)
    special_ids: tuple[int, ...] = ()  # the tokenizer's special tokens: a stratum of their own
    corpus_counts: np.ndarray | None = None  # the training corpus's count per token id, when known

    @property
    def n_targets(self) -> int:
        return int((self.labels != -100).sum())


def causal_lm_batch(input_ids: torch.Tensor, valid: torch.Tensor) -> LMBatch:
    """Next-token targets: position t predicts token t+1 where both are valid."""
    labels = torch.full_like(input_ids, -100)
    both = valid[:, :-1] & valid[:, 1:]
    labels[:, :-1] = torch.where(both, input_ids[:, 1:], labels[:, :-1])
    return LMBatch(input_ids, valid, labels, input_ids)


def masked_lm_batch(
    input_ids: torch.Tensor,
    valid: torch.Tensor,
    mask_token_id: int,
    special_ids: list[int],
    vocab_size: int,
    probability: float,
    seed: int,
) -> LMBatch:
    """BERT masking, seeded, over the whole batch at once: `probability` of the valid non-special tokens are
    targets; of those 80% become [MASK], 10% a random non-special token, 10% stay."""
    g = torch.Generator().manual_seed(seed)
    special = torch.isin(input_ids, torch.tensor(sorted(special_ids), dtype=input_ids.dtype)) | ~valid
    target = (torch.rand(input_ids.shape, generator=g) < probability) & ~special
    if not target.any():  # a tiny batch: at least one target, so that the loss has a gradient
        candidates = (~special).nonzero()
        if not len(candidates):
            raise ValueError("gradients: the evaluation batch has no maskable (valid, non-special) token")
        seq, pos = candidates[torch.randint(len(candidates), (1,), generator=g)][0]
        target[seq, pos] = True
    r = torch.rand(input_ids.shape, generator=g)
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[[i for i in special_ids if 0 <= i < vocab_size]] = False
    replacements = keep.nonzero().squeeze(1)
    random_ids = replacements[torch.randint(0, len(replacements), input_ids.shape, generator=g)]
    inputs = torch.where(target & (r < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    inputs = torch.where(target & (r >= 0.8) & (r < 0.9), random_ids, inputs)
    labels = torch.where(target, input_ids, torch.full_like(input_ids, -100))
    return LMBatch(inputs, valid, labels, input_ids)


def lm_batch(
    batch: dict,
    causal: bool,
    tokenizer=None,
    vocab_size: int | None = None,
    corpus_counts: np.ndarray | None = None,
    **masking,
) -> LMBatch:
    """The LM batch of an evaluation batch: causal targets for a decoder, seeded masking for an encoder (which
    needs the tokenizer's mask token); with the tokenizer's special tokens and the training corpus's token counts
    (`corpus_counts`, when known) for the strata."""
    ids, valid = batch["input_ids"], batch["attention_mask"].bool()
    special = tuple(sorted(tokenizer.all_special_ids)) if tokenizer is not None else ()
    if causal:
        lm = causal_lm_batch(ids, valid)
    elif tokenizer is None or tokenizer.mask_token_id is None:
        raise ValueError("gradients: a masked-LM checkpoint needs a tokenizer with a mask token ([MASK])")
    else:
        lm = masked_lm_batch(
            ids, valid, tokenizer.mask_token_id, list(special), vocab_size or len(tokenizer), **masking
        )
    return dataclasses.replace(lm, special_ids=special, corpus_counts=corpus_counts)


def lm_logits(output) -> torch.Tensor:
    """The LM head's logits (`logits`; BertForPreTraining calls them `prediction_logits`)."""
    for name in ("logits", "prediction_logits"):
        logits = getattr(output, name, None)
        if logits is not None:
            return logits
    raise ValueError(f"gradients: the model's output ({type(output).__name__}) has no LM logits")


def frequency_strata(
    token_ids: torch.Tensor,
    valid: torch.Tensor,
    corpus_counts: np.ndarray | None = None,
    special_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, dict]:
    """Each token's stratum, 0 frequent, 1 middle, 2 rare, 3 special (-1 where not valid). Special tokens
    ([CLS], [SEP], <|endoftext|>: `special_ids`) are a stratum of their own. The others go by the count c of their
    id: in the training corpus (`corpus_counts`, indexed by id; an id past its end counts 0) where known, else over
    the batch's valid tokens; split at the terciles of c over the batch's valid non-special TOKENS (not the
    distinct ids): q1, q2 = the 1/3 and 2/3 quantiles (numpy's linear) of the tokens' counts; frequent c >= q2,
    middle q1 < c < q2, rare c <= q1 (and c < q2). Ties keep equal ids together, so the strata are not exactly
    thirds (the most frequent id alone may hold more than a third of the tokens). The info says which counts:
    `strata_from_corpus` 1 or 0."""
    ids = token_ids.numpy()
    valid_ = valid.numpy()
    special = np.isin(ids, np.asarray(list(special_ids), dtype=ids.dtype)) & valid_
    words = valid_ & ~special
    if corpus_counts is not None:
        counts = np.asarray(corpus_counts, np.float64)
        per_token = np.where(ids < len(counts), counts[np.minimum(ids, len(counts) - 1)], 0.0)
    else:
        per_token = np.bincount(ids[words], minlength=int(ids.max()) + 1)[ids].astype(np.float64)
    q1, q2 = np.quantile(per_token[words], [1 / 3, 2 / 3]) if words.any() else (np.nan, np.nan)
    strata = np.where(per_token >= q2, 0, np.where(per_token > q1, 1, 2))
    strata = np.where(special, 3, np.where(valid_, strata, -1))
    info = {"count_q1": float(q1), "count_q2": float(q2), "strata_from_corpus": float(corpus_counts is not None)}
    return torch.from_numpy(strata), info


def read_token_counts(checkpoint: str | Path) -> np.ndarray | None:
    """The training corpus's count per token id (token_counts.parquet: token_id, count) beside a checkpoint: in
    its folder or the run folder above it (the toys write theirs there); None where there is none."""
    import polars as pl

    from anisweep.tables import TOKEN_COUNTS, read_parquet

    for folder in (Path(checkpoint), Path(checkpoint).parent):
        path = folder / TOKEN_COUNTS
        if path.is_file():
            table = read_parquet(path, columns=["token_id", "count"])
            counts = np.zeros(int(table["token_id"].max()) + 1 if table.height else 0, np.float64)
            counts[table["token_id"].to_numpy()] = table["count"].cast(pl.Float64).to_numpy()
            return counts
    return None
