"""Subspaces held fixed over training (config `gradients.subspaces: fixed | both`): per model, semi-NMF and PCA
bases of rank k fitted once on the activations of an early window of steps, and every analysed checkpoint's
gradient measured against them (anisweep.tangent, rows with fit = "fixed").

The activations are extract's seeded whole-vector sample (hidden.parquet: sites `resid` per layer,
`final_ln_in`, `final_ln_out`) of every swept step of the model inside `gradients.fit_window`, pooled (the
finite rows of each checkpoint's sample, concatenated in step order; by default the swept steps within 1-10% of
the model's final step, `window_steps`). They come from extract's forward pass of
the evaluation batch, which for an encoder has no [MASK]ed positions, where the per-checkpoint fits use the
gradient pass's (masked) activations; for a decoder both read the same forward pass.

Bases are stored as one row per basis column (layer, site, subspace, rank, column, vector), orthonormal; the
rule's table adds `window`, the steps they were fitted on (`window_label`), which the figures name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.errors import ConfigError
from anisweep.tables import read_parquet, vectors
from anisweep.tangent.seminmf import orthonormal_basis, semi_nmf
from anisweep.tangent.settings import SUBSPACES

#: the default window (gradients.fit_window: null) as divisors of the model's final step: the swept steps s > 0
#: with final / 100 <= s <= final / 10, 1-10% of training (see `window_steps`)
DEFAULT_WINDOW_DIVISORS = (100, 10)
METHODS = SUBSPACES

BASES_SCHEMA = {
    "layer": pl.Int64,
    "site": pl.String,
    "subspace": pl.String,
    "rank": pl.Int64,
    "column": pl.Int64,
    "vector": pl.List(pl.Float64),
}


def window_steps(steps: list[int], window: list[int] | None, where: str = "", final: int | None = None) -> list[int]:
    """The swept `steps` whose activations fit the fixed subspaces: those inside `window` = [start, stop]
    (inclusive, gradients.fit_window), or with `window` None the default early-training window.

    The default: the swept steps s > 0 with final / 100 <= s <= final / 10 (DEFAULT_WINDOW_DIVISORS), `final`
    the model's final training step (anisweep.checkpoints.catalogue.final_step: Pythia's 143000 whether or not
    it is swept; a toy's or local run's last step; default max(steps)). Why:
    - step 0 is the initialisation, and the first percent of training is (about) the learning-rate warm-up
      (Pythia: 1430 of 143000 steps; BERT: 10k of 1M; the toys' is longer, 50 of 1000), over which the activation
      subspaces are still the initialisation's: on the default run the rank-16 PCA subspaces of steps 1-4 have
      mean cos^2 >= 0.93 with step 0's at every resid layer of both toys (toy-bert's up to step 16: >= 0.94),
      so a window of the first swept steps of a log-spaced grid (0, 1, 2) measured the initialisation, not
      early training;
    - up to a tenth of training is still early (on the default run step 64's subspaces have mean cos^2 0.41-0.71
      with step 1000's; the window 16, 32, 64 pooled: 0.37-0.66, against 0.30-0.40 for 0, 1, 2), and one decade
      of steps holds about three steps of a log-spaced grid (16, 32, 64 of the default run; Pythia's 2000-14000
      when swept, MultiBERTs' 20k-200k), pooled with equal weight per step;
    - fractions of the final step (not of the swept range) so that the window means the same stage of training
      whichever steps are swept, and it depends on the swept steps and the final step alone: known at config
      time.
    Fallback when no swept step lies in the window: the one swept step s > 0 nearest to it on a log scale
    (the earlier on a tie), e.g. Pythia swept at 0-1000 only: step 1000; with no swept step > 0, step 0 (the
    initialisation is then all there is). The figures name the window's steps (`window_label`).

    An explicit window holding none of the steps is a ConfigError naming the steps to choose from."""
    steps = sorted(set(steps))
    if window is None:
        return default_window(steps, max(steps) if final is None else final)
    if len(window) != 2 or window[0] > window[1]:
        raise ConfigError(f"gradients.fit_window: {window} must be [start, stop] with start <= stop (steps)")
    inside = [s for s in steps if window[0] <= s <= window[1]]
    if not inside:
        raise ConfigError(
            f"gradients.fit_window {window} holds none of the swept steps{' of ' + where if where else ''} "
            f"({steps}); widen it to hold at least one"
        )
    return inside


def default_window(steps: list[int], final: int) -> list[int]:
    """`window_steps`'s default: the sorted distinct swept steps s > 0 in [final / 100, final / 10], else the
    nearest one on a log scale, else the first swept step."""
    steps = sorted(set(steps))
    low, high = (final / divisor for divisor in DEFAULT_WINDOW_DIVISORS)  # int / int: correctly rounded
    trained = [s for s in steps if s > 0]
    inside = [s for s in trained if low <= s <= high]
    if inside or not trained:
        return inside or steps[:1]
    low, high = max(low, 1.0), max(high, 1.0)

    def distance(step: int) -> float:  # in decades, from the window [low, high]
        return max(np.log10(low / step), np.log10(step / high), 0.0)

    return [min(trained, key=lambda s: (distance(s), s))]


def window_label(steps: list[int]) -> str:
    """How the figures name a fit window: its steps, or the first and last and how many when there are more
    than four."""
    steps = sorted(set(steps))
    if len(steps) <= 4:
        return f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
    return f"steps {steps[0]}-{steps[-1]} ({len(steps)} swept steps)"


def window_of(frame: pl.DataFrame) -> str | None:
    """The `window` label of a gradient_fixed_bases table (None for a table written before it had one)."""
    if "window" not in frame.columns or not frame.height:
        return None
    return frame["window"][0]


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
            x = vectors(rows["vector"]).astype(np.float64)
            parts.append(x[np.isfinite(x).all(1)])
    if not parts:
        raise ValueError(f"gradient fixed subspaces: no sampled vectors of layer {layer} {site} in the window")
    return np.concatenate(parts)


def fit_bases(x: np.ndarray, rank: int, seed: int, max_iter: int) -> dict[str, np.ndarray]:
    """Orthonormal semi-NMF and PCA (centred, uncentred) bases of rank `rank` of x (as the per-checkpoint fits of
    anisweep.tangent.analysis)."""
    from anisweep.tangent.shares import reference_bases

    if rank >= x.shape[1] or rank > len(x):
        raise ValueError(
            f"gradients.rank {rank} must be less than d_model = {x.shape[1]} and at most the {len(x)} pooled tokens "
            "of the fit window; lower gradients.rank or widen gradients.fit_window"
        )
    return {"seminmf": orthonormal_basis(semi_nmf(x, rank, seed=seed, max_iter=max_iter).F), **reference_bases(x, rank)}


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
        bases.setdefault((layer, site, rank), {})[method] = np.ascontiguousarray(vectors(group["vector"]).T)
    return bases


def read_fixed_bases(path: str | Path) -> dict[tuple[int, str, int], dict[str, np.ndarray]]:
    return bases_from_frame(read_parquet(path))


def fixed_bases_file(hidden_paths: list[str | Path], settings, out: str | Path) -> None:
    """The gradient_fixed_bases rule: fit from the window's hidden.parquet files, write the bases' Parquet with a
    `window` column naming the steps they were fitted on (`window_label`), which the fixed-subspace rows and
    figures carry."""
    from anisweep.tables import write_atomic

    hidden = [read_parquet(p, columns=["step", "layer", "site", "vector"]) for p in hidden_paths]
    window = window_label([int(step) for table in hidden for step in table["step"].unique()])
    frame = bases_frame(fit_fixed_bases([t.drop("step") for t in hidden], settings))
    write_atomic(frame.with_columns(window=pl.lit(window, pl.String)), out)


def check_config(
    gradients: dict, steps_by_model: dict[str, list[int]], final_by_model: dict[str, int] | None = None
) -> None:
    """The gradients section's fixed-subspace and embedding-change settings against the swept steps of each
    analysed model (`{"family/model": steps}`; `final_by_model`: their final training steps, for the default
    fit window): a ConfigError names what is wrong and what to do."""
    if not gradients.get("enabled"):
        return
    if gradients.get("subspaces", "per_checkpoint") != "per_checkpoint":
        for model, steps in steps_by_model.items():
            window_steps(steps, gradients.get("fit_window"), model, (final_by_model or {}).get(model))
    layers = gradients.get("layers")
    if gradients.get("embedding_change") and layers is not None and 0 not in layers:
        raise ConfigError(
            f"gradients.embedding_change reads the subspaces of the embedding output (layer 0), but gradients.layers "
            f"is {layers}; add 0 to it or set embedding_change: false"
        )
