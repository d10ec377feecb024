"""The masked pass of a masked language model: the residual stream at masked positions, for the logit lens of an
encoder (anisweep.measures.logit_lens), whose target is the token that was masked.

An encoder sees every token it is asked about, so reading its unmasked states through the MLM head asks it to copy
its input. The lens asks instead what BERT was trained to answer: a seeded MASK_SHARE of the text tokens of the
first mini-batch (BERT's pretraining share; never a special token, never padding) replaced by the mask token, one
more forward of that mini-batch (eager attention, no statistics recorded), and every layer's residual state at
the masked positions kept (`masked_resid.parquet`). One mini-batch: the lens is a mean over a few hundred tokens,
and the pass costs one mini-batch of extract's forward (a sixteenth of `config/multiberts.yaml`'s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: The share of a sequence's text tokens masked (Devlin et al. 2019: 15%), at least one per sequence.
MASK_SHARE = 0.15


@dataclass
class MaskedStates:
    """The masked positions (seq, position), the token each held (the lens's target), and the residual stream there
    per layer (0 the embeddings, l the output of block l): {layer: (n, d_model) float32}."""

    seq: np.ndarray
    position: np.ndarray
    token_id: np.ndarray
    states: dict[int, np.ndarray]


def masked_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(seq, position) sorted: per sequence a seeded MASK_SHARE (rounded, at least one) of its valid tokens that are
    not special tokens; the same batch and seed always give the same positions."""
    ids, valid = input_ids.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
    text = valid & ~np.isin(ids, np.asarray(list(special_ids), dtype=ids.dtype))
    rng = np.random.default_rng(seed)
    seqs, positions = [], []
    for s in range(ids.shape[0]):
        candidates = np.flatnonzero(text[s])
        if not len(candidates):
            continue
        n = max(1, round(MASK_SHARE * len(candidates)))
        chosen = np.sort(rng.choice(candidates, size=n, replace=False))
        seqs.append(np.full(n, s, dtype=np.int64))
        positions.append(chosen.astype(np.int64))
    if not seqs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(seqs), np.concatenate(positions)


@torch.inference_mode()
def masked_pass(base, batch: dict, batch_size: int, seed: int, device) -> MaskedStates | None:
    """The masked pass over the first `batch_size` sequences of a text batch from make_batch, or None where the
    tokenizer has no mask token (`mask_token_id` absent). `base` is a Hugging Face base model whose
    `output_hidden_states` are its residual stream (BERT, RoBERTa)."""
    if batch.get("mask_token_id") is None:
        return None
    ids = batch["input_ids"][:batch_size]
    mask = batch["attention_mask"][:batch_size]
    seq, position = masked_positions(ids, mask, batch["special_ids"], seed)
    token_id = ids[seq, position].numpy().astype(np.int64)
    masked = ids.clone()
    masked[seq, position] = batch["mask_token_id"]
    own = base.config._attn_implementation
    base.set_attn_implementation("eager")  # extract's attention records into a Recorder; this pass records nothing
    try:
        hidden = base(
            input_ids=masked.to(device), attention_mask=mask.to(device), output_hidden_states=True, use_cache=False
        ).hidden_states
    finally:
        base.set_attn_implementation(own)
    states = {layer: h[seq, position].float().cpu().numpy() for layer, h in enumerate(hidden)}
    return MaskedStates(seq, position, token_id, states)
