"""Normalised singular-value spectra of one checkpoint's sampled vectors (spectra.parquet): the hidden-state
sample per site (hidden.parquet) and the sampled queries and keys per head (qk_sample.parquet).

The SVD is of the raw (uncentred) vectors, so a dominant first value is the common drift; the centred
spectrum's top share is `top_eig_share` in metrics.parquet. `share` is s_i / sum_j s_j. These spectra are this
project's own measure (Godey et al. 2024 show none; their Fig. 17/18 are cosine-similarity distributions of
isotropic Gaussians); the figure's isotropic baseline is the Marchenko-Pastur law (anisweep.plots.spectra).

After a LayerNorm with gain g and bias b every vector has the same component <b, w> along w = (1/g)/||1/g||
(the normalised part is centred), so the last singular value is about zero (float32 rounding) only while that
component is zero, e.g. while b = 0 as at initialisation; a trained bias lifts it, to at most sqrt(n)|<b, w>|."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.grouped import vectors_by_group
from anisweep.tables import IDENTITY, read_parquet, with_identity

SCHEMA = {
    "layer": pl.Int64,
    "head": pl.Int64,
    "site": pl.String,
    "vectors": pl.String,
    "index": pl.Int64,
    "singular_value": pl.Float64,
    "share": pl.Float64,
    "n": pl.Int64,
}


def spectrum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(singular values, descending; each over their sum) of the finite rows of x."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x).all(axis=1)]
    if len(x) == 0:
        return np.zeros(0), np.zeros(0)
    singular = np.linalg.svd(x, compute_uv=False)
    total = singular.sum()
    return singular, (singular / total if total > 0 else np.full_like(singular, np.nan))


def _rows(layer, head, site, vectors: str, x: np.ndarray) -> list[dict]:
    singular, share = spectrum(x)
    return [
        {
            "layer": layer,
            "head": head,
            "site": site,
            "vectors": vectors,
            "index": i + 1,
            "singular_value": float(s),
            "share": float(f),
            "n": len(x),
        }
        for i, (s, f) in enumerate(zip(singular, share))
    ]


def checkpoint_spectra(extract_dir: str | Path) -> pl.DataFrame:
    """Every spectrum of one checkpoint: vectors `hidden` (head null) per (layer, site), `q` and `k` per
    (layer, head, site qk_pre/qk_post)."""
    extract_dir = Path(extract_dir)
    hidden = read_parquet(extract_dir / "hidden.parquet")
    qk = read_parquet(extract_dir / "qk_sample.parquet")
    rows = []
    for (layer, site), group in vectors_by_group(hidden, ("layer", "site"), ("vector",)):
        rows += _rows(layer, None, site, "hidden", group["vector"])
    for (layer, head, rope), group in vectors_by_group(qk, ("layer", "head", "rope"), ("q", "k")):
        for which in ("q", "k"):
            rows += _rows(layer, head, f"qk_{rope}", which, group[which])
    ident = {key: hidden[key][0] for key in IDENTITY}
    return with_identity(pl.DataFrame(rows, schema=SCHEMA), ident)
