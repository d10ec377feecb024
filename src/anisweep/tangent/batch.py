"""The loss batch of the gradient analysis: masked-LM targets for encoders, next-token targets for decoders,
and the tokens' frequency strata.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def lm_batch(batch: dict, causal: bool, tokenizer=None, vocab_size: int | None = None, **masking) -> LMBatch:
    """The LM batch of an evaluation batch: causal targets for a decoder, seeded masking for an encoder (which
    needs the tokenizer's mask token)."""
    ids, valid = batch["input_ids"], batch["attention_mask"].bool()
    if causal:
        return causal_lm_batch(ids, valid)
    if tokenizer is None or tokenizer.mask_token_id is None:
        raise ValueError("gradients: a masked-LM checkpoint needs a tokenizer with a mask token ([MASK])")
    return masked_lm_batch(
        ids, valid, tokenizer.mask_token_id, list(tokenizer.all_special_ids), vocab_size or len(tokenizer), **masking
    )


def lm_logits(output) -> torch.Tensor:
    """The LM head's logits (`logits`; BertForPreTraining calls them `prediction_logits`)."""
    for name in ("logits", "prediction_logits"):
        logits = getattr(output, name, None)
        if logits is not None:
            return logits
    raise ValueError(f"gradients: the model's output ({type(output).__name__}) has no LM logits")


def frequency_strata(token_ids: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Each token's stratum, 0 frequent, 1 middle, 2 rare (-1 where not valid), by the count c of its id over
    the batch's valid tokens, split at the terciles of c over the valid TOKENS (not the distinct ids):
    q1, q2 = the 1/3 and 2/3 quantiles (numpy's linear) of the tokens' counts; frequent c >= q2, middle
    q1 < c < q2, rare c <= q1 (and c < q2). Ties keep equal ids together, so the strata are not exactly thirds
    (the most frequent id alone may hold more than a third of the tokens)."""
    ids = token_ids[valid]
    counts = torch.bincount(ids, minlength=int(token_ids.max()) + 1)
    per_token = counts[token_ids].double().numpy()
    q1, q2 = np.quantile(per_token[valid.numpy()], [1 / 3, 2 / 3])
    strata = np.where(per_token >= q2, 0, np.where(per_token > q1, 1, 2))
    strata = np.where(valid.numpy(), strata, -1)
    return torch.from_numpy(strata), {"count_q1": float(q1), "count_q2": float(q2)}
