"""Subspaces held fixed over training (config `gradients.subspaces: fixed | both`): per model, semi-NMF and PCA
bases of rank k fitted once on the activations of an early window of steps, and every analysed checkpoint's
gradient measured against them (anisweep.tangent, rows with fit = "fixed").

The activations are extract's seeded whole-vector sample (hidden.parquet: sites `resid` per layer,
`final_ln_in`, `final_ln_out`) of every swept step of the model inside `gradients.fit_window`, pooled (the
finite rows of each checkpoint's sample, concatenated in step order). They come from extract's forward pass of
the evaluation batch, which for an encoder has no [MASK]ed positions, where the per-checkpoint fits use the
gradient pass's (masked) activations; for a decoder both read the same forward pass.

Bases are stored as one row per basis column (layer, site, subspace, rank, column, vector), orthonormal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.errors import ConfigError
from anisweep.tables import read_parquet
from anisweep.tangent.seminmf import orthonormal_basis, semi_nmf

#: the default window: the model's first swept steps
DEFAULT_WINDOW_STEPS = 3
METHODS = ("seminmf", "pca")

BASES_SCHEMA = {
    "layer": pl.Int64,
    "site": pl.String,
    "subspace": pl.String,
    "rank": pl.Int64,
    "column": pl.Int64,
    "vector": pl.List(pl.Float64),
}


def window_steps(steps: list[int], window: list[int] | None, where: str = "") -> list[int]:
    """The swept `steps` inside `window` = [start, stop] (inclusive); None: the first DEFAULT_WINDOW_STEPS.
    A window holding none of them is a ConfigError naming the steps to choose from."""
    steps = sorted(set(steps))
    if window is None:
        return steps[:DEFAULT_WINDOW_STEPS]
    if len(window) != 2 or window[0] > window[1]:
        raise ConfigError(f"gradients.fit_window: {window} must be [start, stop] with start <= stop (steps)")
    inside = [s for s in steps if window[0] <= s <= window[1]]
    if not inside:
        raise ConfigError(
            f"gradients.fit_window {window} holds none of the swept steps{' of ' + where if where else ''} "
            f"({steps}); widen it to hold at least one"
        )
    return inside


def fixed_sites(available: set[tuple[int, str]], layers: list[int] | None, final_ln: bool) -> list[tuple[int, str]]:
    """The gradient analysis's sites (as anisweep.tangent.backward.gradient_sites picks them) among extract's sampled
    sites `available`: the resid layers (default 0, n_layers // 2, and n_layers unless final_ln), and the final
    LayerNorm's input and output when final_ln."""
    resid = sorted(layer for layer, site in available if site == "resid")
    if not resid:
        raise ValueError("gradient fixed subspaces: hidden.parquet has no resid site")
    n_layers = resid[-1]
    default = {0, n_layers // 2} if final_ln else {0, n_layers // 2, n_layers}
    chosen = layers if layers is not None else sorted(default)
    missing = sorted(set(chosen) - set(resid))
    if missing:
        raise ValueError(f"gradients.layers: {missing} are not sampled resid layers (0..{n_layers}) of hidden.parquet")
    sites = [(layer, "resid") for layer in chosen]
    if final_ln:
        sites += sorted(key for key in available if key[1] in ("final_ln_in", "final_ln_out"))
    return sites


def pooled_sample(hidden: list[pl.DataFrame], layer: int, site: str) -> np.ndarray:
    """The finite sampled vectors of (layer, site) of every table, concatenated in the given order."""
    parts = []
    for table in hidden:
        rows = table.filter((pl.col("layer") == layer) & (pl.col("site") == site))
        if rows.height:
            x = np.stack(rows["vector"].to_list()).astype(np.float64)
            parts.append(x[np.isfinite(x).all(1)])
    if not parts:
        raise ValueError(f"gradient fixed subspaces: no sampled vectors of layer {layer} {site} in the window")
    return np.concatenate(parts)


def fit_bases(x: np.ndarray, rank: int, seed: int, max_iter: int) -> dict[str, np.ndarray]:
    """Orthonormal semi-NMF and PCA bases of rank `rank` of x (as the per-checkpoint fits of anisweep.tangent)."""
    from anisweep.tangent.shares import pca_basis

    if rank > min(x.shape):
        raise ValueError(
            f"gradients.rank {rank} is larger than d_model = {x.shape[1]} or the {len(x)} pooled tokens of the "
            "fit window; lower gradients.rank or widen gradients.fit_window"
        )
    return {
        "seminmf": orthonormal_basis(semi_nmf(x, rank, seed=seed, max_iter=max_iter).F),
        "pca": pca_basis(x, rank),
    }


def fit_fixed_bases(hidden: list[pl.DataFrame], settings) -> dict[tuple[int, str, int], dict[str, np.ndarray]]:
    """{(layer, site, rank): {"seminmf": U, "pca": U}} from the window's hidden.parquet tables, pooled."""
    available = set()
    for table in hidden:
        available |= set(table.select("layer", "site").unique().rows())
    bases = {}
    for layer, site in fixed_sites(available, settings.layers, settings.final_ln):
        x = pooled_sample(hidden, layer, site)
        for rank in settings.ranks():
            bases[(layer, site, rank)] = fit_bases(x, rank, settings.seed, settings.max_iter)
    return bases


def bases_frame(bases: dict[tuple[int, str, int], dict[str, np.ndarray]]) -> pl.DataFrame:
    """One row per basis column: layer, site, subspace, rank, column, vector."""
    rows = []
    for (layer, site, rank), by_method in sorted(bases.items()):
        for method, basis in by_method.items():
            rows += [
                {
                    "layer": layer,
                    "site": site,
                    "subspace": method,
                    "rank": rank,
                    "column": j,
                    "vector": basis[:, j].tolist(),
                }
                for j in range(basis.shape[1])
            ]
    return pl.DataFrame(rows, schema=BASES_SCHEMA)


def bases_from_frame(frame: pl.DataFrame) -> dict[tuple[int, str, int], dict[str, np.ndarray]]:
    """The inverse of `bases_frame`."""
    bases: dict = {}
    # in the file's order (group_by's own order varies from run to run, and the rows follow it)
    for (layer, site, method, rank), group in frame.group_by("layer", "site", "subspace", "rank", maintain_order=True):
        group = group.sort("column")
        bases.setdefault((layer, site, rank), {})[method] = np.stack(group["vector"].to_list(), axis=1)
    return bases


def read_fixed_bases(path: str | Path) -> dict[tuple[int, str, int], dict[str, np.ndarray]]:
    return bases_from_frame(read_parquet(path))


def fixed_bases_file(hidden_paths: list[str | Path], settings, out: str | Path) -> None:
    """The gradient_fixed_bases rule: fit from the window's hidden.parquet files, write the bases' Parquet."""
    from anisweep.tables import write_atomic

    hidden = [read_parquet(p, columns=["layer", "site", "vector"]) for p in hidden_paths]
    write_atomic(bases_frame(fit_fixed_bases(hidden, settings)), out)


def check_config(gradients: dict, steps_by_model: dict[str, list[int]]) -> None:
    """The gradients section's fixed-subspace and embedding-change settings against the swept steps of each
    analysed model (`{"family/model": steps}`): a ConfigError names what is wrong and what to do."""
    if not gradients.get("enabled"):
        return
    if gradients.get("subspaces", "per_checkpoint") != "per_checkpoint":
        for model, steps in steps_by_model.items():
            window_steps(steps, gradients.get("fit_window"), model)
    layers = gradients.get("layers")
    if gradients.get("embedding_change") and layers is not None and 0 not in layers:
        raise ConfigError(
            f"gradients.embedding_change reads the subspaces of the embedding output (layer 0), but gradients.layers "
            f"is {layers}; add 0 to it or set embedding_change: false"
        )
