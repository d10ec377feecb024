"""The logit lens over the layers (nostalgebraist 2020; the journey of Molina 2023, "Traveling Words"), from
extract's states and the checkpoint's own head: no forward pass of its own.

A decoder's states: extract keeps the residual stream of a seeded sample of the evaluation batch's tokens at every
layer (hidden.parquet, site `resid`: 0 the embeddings, l the output of block l), and the target is the next token
(the batch, rebuilt from the corpus and the tokenizer exactly as extract built it, gives it; a sampled token at the
end of its sequence has none and is left out). An encoder's: extract's masked pass (anisweep.extract.masked) masks
15% of the first mini-batch's text tokens and keeps every layer's state at them (masked_resid.parquet), and the
target is the token masked, what an MLM is trained to predict (an unmasked token would only be copied). Each state
is read through the model's own head (anisweep.weights.layout: the final norm then the unembedding; an encoder's
whole MLM head). Per layer:

- `lens_rank`: mean rank of the target among the vocabulary (0: the top logit), `lens_top1`: the share at rank 0,
  `lens_log_rank`: mean log(1 + rank);
- `lens_prob`: mean probability of the target;
- `lens_kl`: mean KL(p_last || p_layer), in nats, to the last layer's distribution (0 at the last layer);
- `lens_angle`: mean angle (radians) between a token's centred states at layer l - 1 and l (LayerNorm's
  hypersphere: centring and scaling), the step of its journey into layer l.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

CHUNK = 256


def lens_rows(
    states: dict[int, np.ndarray],
    targets: np.ndarray,
    head: Callable[[torch.Tensor], torch.Tensor],
) -> list[dict]:
    """Metric rows per layer (site `resid`) from `states` {layer: (n, d_model)} of the same n tokens, `targets`
    (n,) token ids (-1: none, left out of the lens but not of the angles), `head` the model's map to logits."""
    layers = sorted(states)
    has = torch.from_numpy(targets >= 0)
    target = torch.from_numpy(np.where(targets >= 0, targets, 0)).long()
    n = int(has.sum())
    last = layers[-1]
    sums = {layer: dict.fromkeys(("rank", "top1", "log_rank", "prob", "kl"), 0.0) for layer in layers}
    for start in range(0, len(targets), CHUNK):
        rows = slice(start, start + CHUNK)
        keep = has[rows]
        if not keep.any():
            continue
        final = torch.log_softmax(head(torch.from_numpy(states[last][rows])[keep]), -1)
        t = target[rows][keep]
        for layer in layers:
            logp = final if layer == last else torch.log_softmax(head(torch.from_numpy(states[layer][rows])[keep]), -1)
            own = logp.gather(1, t[:, None])
            rank = (logp > own).sum(1).double()
            s = sums[layer]
            s["rank"] += float(rank.sum())
            s["top1"] += float((rank == 0).sum())
            s["log_rank"] += float(torch.log1p(rank).sum())
            s["prob"] += float(own.exp().sum())
            s["kl"] += float((final.exp() * (final - logp)).sum())
    out = []
    for layer in layers:
        at = {"layer": layer, "site": "resid"}
        out += [
            at | {"metric": f"lens_{name}", "value": value / n if n else None} for name, value in sums[layer].items()
        ]
        if layer - 1 in states:
            out.append(at | {"metric": "lens_angle", "value": mean_angle(states[layer - 1], states[layer])})
    out.append({"metric": "lens_tokens", "site": "resid", "value": float(n)})
    return out


def mean_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of the angle (radians) between the centred rows of a and b."""
    a = a.astype(np.float64) - a.mean(1, keepdims=True)
    b = b.astype(np.float64) - b.mean(1, keepdims=True)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)
    return float(np.arccos(np.clip(cos, -1.0, 1.0)).mean()) if len(cos) else math.nan


def targets_of(input_ids: np.ndarray, mask: np.ndarray, seq: np.ndarray, position: np.ndarray, encoder: bool):
    """The token each sampled (seq, position) is read against: its own (encoder) or the next one where the next
    position is a real token (decoder), else -1."""
    if encoder:
        return input_ids[seq, position].astype(np.int64)
    nxt = position + 1
    inside = nxt < input_ids.shape[1]
    safe = np.where(inside, nxt, 0)
    ok = inside & (mask[seq, safe] == 1)
    return np.where(ok, input_ids[seq, safe], -1).astype(np.int64)
