"""The built-in weight measure `weight_matrices`: each weight matrix's condition number and Gini and Hoyer sparsity
(pico-lm/pico-analyze's definitions, anisweep.measures.spectral), from the weights alone.

The matrices are each layer's W_Q, W_K, W_V (all heads stacked, heads x d_head rows by d_model columns; a grouped-
query model's key and value heads once each, not repeated for the query heads that share them) and W_O (d_model x
heads d_head), at the sites w_q, w_k, w_v, w_o; the token embedding (embed_in, layer null) and, where it is not tied
to it, the unembedding (embed_out). Biases are not weights of the matrices.
"""

from __future__ import annotations

from anisweep.measures.registry import BUILTIN_WEIGHT, weight_measure
from anisweep.measures.spectral import matrix_values

ATTENTION_SITES = ("w_q", "w_k", "w_v", "w_o")
EMBEDDING_SITES = ("embed_in", "embed_out")


def _rows(site: str, layer: int | None, w) -> list[dict]:
    return [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in matrix_values(w.numpy()).items()]


def matrix_rows(weights) -> list[dict]:
    """The rows of every matrix of the checkpoint `weights` (anisweep.weights.checkpoint.CheckpointWeights)."""
    s = weights.shapes
    rows = _rows("embed_in", None, weights.embedding())
    if not weights.tied:
        rows += _rows("embed_out", None, weights.unembedding())
    group = s.n_heads // s.kv_heads if s.kv_heads else 1
    for layer in range(s.n_layers):
        heads = weights.attention(layer)
        rows += _rows("w_q", layer, heads.q.reshape(-1, s.d_model))
        rows += _rows("w_k", layer, heads.k[::group].reshape(-1, s.d_model))
        rows += _rows("w_v", layer, heads.v[::group].reshape(-1, s.d_model))
        rows += _rows("w_o", layer, heads.o.permute(1, 0, 2).reshape(s.d_model, -1))
    return rows


@weight_measure(
    name="weight_matrices",
    tensors=("embedding", "unembedding", "attention"),
    builtin_figures=BUILTIN_WEIGHT["weight_matrices"],
)
def weight_matrices(weights):
    """Each weight matrix's condition number (s_max / s_min) and Gini and Hoyer sparsity of its entries, as
    pico-analyze defines them: every layer's W_Q, W_K, W_V, W_O and the embedding and (untied) unembedding."""
    return matrix_rows(weights)
