"""The attention heads' circuits read through the vocabulary (Molina 2023, "Traveling Words"; Elhage et al. 2021),
from the weights alone: the built-in weight measure `circuits`.

Per layer l and head h, with X the probe tokens' embeddings normalised by the norm that acts before layer l's
attention (LayerNorm puts them on its hypersphere; anisweep.weights.layout names it per architecture) and U the
unembedding times the final norm's gain (an encoder's MLM decoder times its transform LayerNorm's gain; a BERT saved
without its MLM head: the word embeddings its decoder is tied to, without a gain, and `head_saved` 0):

- W_QK = W_Q[h]^T W_K[h] and the scores S = X W_QK X^T / sqrt(d_head): which token attends to which, with position
  left out (rotary models: the scores at equal positions). The singular values are W_QK's, unscaled: Molina 2023's
  code (santiag0m/traveling-words, svd_analysis.py) takes those of W_QK / sqrt(d_head), sqrt(d_head) times smaller;
  every share and rank here is the same either way;
- W_OV = W_O[h] W_V[h] and the logits L = X W_OV^T U^T: which output token each input token promotes.

The probe is every token where the vocabulary has at most PROBE_TOKENS, else a seeded sample of that many (the
copying score's argmax still runs over the whole vocabulary). Biases are not weights of W_QK and W_OV.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from anisweep.measures.registry import BUILTIN_WEIGHT, WEIGHT_SITE, weight_measure

SITE = WEIGHT_SITE  # the rows' site: the checkpoint's weights, no activations
PROBE_TOKENS = 4096
TOP_PAIRS = 5
CHUNK = 512


def probe_ids(vocab: int, n: int = PROBE_TOKENS, seed: int = 0) -> torch.Tensor:
    """Every token id when vocab <= n, else n distinct ids drawn with `seed`, sorted."""
    if vocab <= n:
        return torch.arange(vocab)
    return torch.from_numpy(np.sort(np.random.default_rng(seed).choice(vocab, n, replace=False)))


def symmetric_share(a: torch.Tensor, b: torch.Tensor) -> float:
    """||(W + W^T)/2||_F^2 / ||W||_F^2 of W = a^T b (a, b: rank x d), from rank x rank products: 1 for a symmetric
    W, 0 for an antisymmetric one. ||W||^2 = tr((a a^T)(b b^T)), <W, W^T> = tr((b a^T)(b a^T))."""
    norm = float(torch.trace((a @ a.T) @ (b @ b.T)))
    cross = float(torch.trace((b @ a.T) @ (b @ a.T)))
    return (norm + cross) / (2 * norm) if norm > 0 else float("nan")


def singular_values(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """The singular values of a^T b (a, b: rank x d), from the QR factors of a^T and b^T (rank x rank)."""
    ra, rb = torch.linalg.qr(a.T).R, torch.linalg.qr(b.T).R
    return [float(v) for v in torch.linalg.svdvals(ra @ rb.T)]


def positive_eigen_share(o: torch.Tensor, v: torch.Tensor, x: torch.Tensor, u: torch.Tensor) -> float:
    """sum(Re lambda) / sum(|lambda|) over the eigenvalues of the full OV circuit on the probe, U_p W_O W_V X^T (probe
    x probe), from the d_head x d_head matrix W_V X^T U_p W_O, which has the same non-zero eigenvalues (Elhage et
    al. 2021: near 1 for a copying head)."""
    eig = torch.linalg.eigvals(v @ x.T @ u @ o)
    total = float(eig.abs().sum())
    return float(eig.real.sum()) / total if total > 0 else float("nan")


def _best_per_row(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest entry and its column (the first of a tie), through numpy's argmax (weights are read on the
    CPU): torch's max over a dimension, values and indices, took ten times as long."""
    array = values.numpy()
    columns = array.argmax(1)
    return torch.from_numpy(array[np.arange(len(array)), columns]), torch.from_numpy(columns)


def _count_per_row(condition: np.ndarray) -> torch.Tensor:
    """The True entries of each row, as float64 (numpy's sum of a bool matrix: a third of torch's time)."""
    return torch.from_numpy(condition.sum(1, dtype=np.int64).astype(np.float64))


def _pairs(row_max: torch.Tensor, row_arg: torch.Tensor, k: int) -> list[tuple[float, int, int]]:
    """The k rows of largest maximum, as (value, row, its best column): each source token once."""
    order = row_max.topk(min(k, len(row_max))).indices
    return [(float(row_max[i]), int(i), int(row_arg[i])) for i in order]


def qk_head(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, top: int = TOP_PAIRS) -> dict:
    """Self-attention of the probe under one head (q, k: its W_Q, W_K, d_head x d_model): the mean rank of each
    query's own key among the probe's keys (0 first, over n - 1), the share of queries whose top key is their own,
    and the `top` queries of largest best score x_i^T W_QK x_j / sqrt(d_head), each with its best key, as (score,
    query index, key index).

    Ties are broken at random, in expectation: a query whose own key ties with t others has the mid-rank (the keys
    above it, plus t / 2) and counts 1 / (t + 1) as attending most to itself when none is above. A fully tied row
    (a zero normalised embedding: every score 0) thus ranks itself (n - 1) / 2, chance, not first."""
    n, d_head = x.shape[0], q.shape[0]
    queries, keys = x @ q.T / math.sqrt(d_head), x @ k.T
    ranks, tops, maxima, args = [], [], [], []
    for start in range(0, n, CHUNK):
        s = queries[start : start + CHUNK] @ keys.T
        rows = torch.arange(s.shape[0])
        own = s[rows, start + rows][:, None]
        above = _count_per_row(s.numpy() > own.numpy())
        tied = _count_per_row(s.numpy() == own.numpy()) - 1  # tied: the others
        ranks.append(above + tied / 2)
        tops.append(torch.where(above == 0, 1 / (tied + 1), 0.0))
        best = _best_per_row(s)
        maxima.append(best[0])
        args.append(best[1])
    return {
        "self_rank": float(torch.cat(ranks).mean()) / max(n - 1, 1),
        "self_top": float(torch.cat(tops).mean()),
        "pairs": _pairs(torch.cat(maxima), torch.cat(args), top),
    }


def ov_head(o: torch.Tensor, v: torch.Tensor, x: torch.Tensor, u: torch.Tensor, ids, top: int = TOP_PAIRS) -> dict:
    """What one head (o: W_O, d_model x d_head; v: W_V) writes for each probe token, read through the whole
    unembedding: the share of probe tokens whose largest logit is their own token, and the `top` inputs of largest
    best logit, each with the output it promotes most, as (logit, input index, output token id)."""
    # logits = x W_V^T W_O^T U^T, multiplied through d_head, not d_model: (x W_V^T)(U W_O)^T
    values, read = x @ v.T, u @ o
    maxima, args = [], []
    for start in range(0, x.shape[0], CHUNK):
        best = _best_per_row(values[start : start + CHUNK] @ read.T)
        maxima.append(best[0])
        args.append(best[1])
    promoted = torch.cat(args)
    return {
        "copying": float((promoted == ids).double().mean()),
        "pairs": _pairs(torch.cat(maxima), promoted, top),
    }


def final_gain(weights) -> torch.Tensor | None:
    """The gain of the norm before the unembedding; none where the checkpoint was saved without its head (a
    BertModel: its MLM decoder is the word embeddings, its transform LayerNorm is not saved)."""
    if not weights.head_saved:
        return None
    return weights.final_norm().weight


def circuit_tables(weights, probe_tokens: int = PROBE_TOKENS) -> tuple[list[dict], list[dict]]:
    """(metric rows, pair rows) of every layer and head of the checkpoint `weights` (CheckpointWeights), probed
    with at most `probe_tokens` tokens."""
    s = weights.shapes
    ids = probe_ids(s.vocab_size, probe_tokens)
    embedding = weights.embedding()[ids]
    gain = final_gain(weights)
    u = weights.unembedding()
    u = u * gain if gain is not None else u
    u_probe = u[ids]
    rows = [
        {"metric": "tied_embeddings", "site": SITE, "value": float(weights.tied)},
        {"metric": "head_saved", "site": SITE, "value": float(weights.head_saved)},
        {"metric": "probe_tokens", "site": SITE, "value": float(len(ids))},
    ]
    pairs = []
    for layer in range(s.n_layers):
        x = weights.attention_norm(layer)(embedding)
        heads = weights.attention(layer)
        for h in range(s.n_heads):
            q, k, v, o = heads.q[h], heads.k[h], heads.v[h], heads.o[h]
            qk, ov = qk_head(q, k, x), ov_head(o, v, x, u, ids)
            at = {"layer": layer, "head": h, "site": SITE}
            rows += [
                at | {"metric": "qk_self_rank", "value": qk["self_rank"]},
                at | {"metric": "qk_self_top", "value": qk["self_top"]},
                at | {"metric": "qk_symmetric_share", "value": symmetric_share(q, k)},
                at | {"metric": "ov_copying", "value": ov["copying"]},
                at | {"metric": "ov_positive_eigen", "value": positive_eigen_share(o, v, x, u_probe)},
            ]
            for name, (a, b) in (("qk", (q, k)), ("ov", (o.T, v))):
                sv = singular_values(a, b)
                power = sum(val * val for val in sv)
                rows.append(at | {"metric": f"{name}_top_sv_share", "value": sv[0] ** 2 / power if power else None})
                rows += [
                    at | {"metric": f"{name}_singular_value", "rank": r + 1, "value": val} for r, val in enumerate(sv)
                ]
            at = {"layer": layer, "head": h}
            pairs += [
                at | {"kind": "qk", "rank": r + 1, "score": v, "src_id": int(ids[i]), "dst_id": int(ids[j])}
                for r, (v, i, j) in enumerate(qk["pairs"])
            ]
            pairs += [
                at | {"kind": "ov", "rank": r + 1, "score": v, "src_id": int(ids[i]), "dst_id": j}
                for r, (v, i, j) in enumerate(ov["pairs"])
            ]
    strings = weights.tokens([p["src_id"] for p in pairs] + [p["dst_id"] for p in pairs])
    for p, src, dst in zip(pairs, strings[: len(pairs)], strings[len(pairs) :], strict=True):
        p["src_token"], p["dst_token"] = src, dst
    return rows, pairs


@weight_measure(
    name="circuits",
    tensors=("embedding", "unembedding", "final_norm", "attention", "attention_norm"),
    builtin_figures=BUILTIN_WEIGHT["circuits"],
)
def circuits(weights):
    """Each head's W_QK and W_OV read through the vocabulary, from the weights alone (Molina 2023; Elhage et al.
    2021): the probe tokens' self-attention under W_QK through their normalised embeddings, the symmetric share of
    W_QK, the copying score and positive-eigenvalue share of the OV circuit through the unembedding, the singular
    values of both; weight_pairs.parquet holds each head's top token pairs."""
    return circuit_tables(weights)[0]
