"""Tangent-aligned anisotropy: does the true LM-loss gradient live in low-rank subspaces fitted to the
activations (seeds 000/001)?

One backward pass of the model's own LM loss over the evaluation batch (masked LM, 15% of non-special tokens
seeded, 80/10/10 as in training, for encoders; next-token loss for decoders), with the gradient of the loss
(the mean over every target of the batch) with respect to the residual stream at a few sites. Per site, the
pass keeps only float64 sums (per frequency stratum: the gradients' second-moment matrix, mean and unit-vector
sums; the activations' unit-vector sums) and a seeded sample of tokens (activations and gradients): extract's
job writes them as Parquet (anisweep.tangent.pass_tables), and everything below is computed from those files.

Per site, rank-k subspaces are fitted to the sampled activations: semi-NMF (anisweep.tangent.seminmf, the "tangent
proxies") and PCA (top-k principal axes of the centred activations), against `n_random` seeded Gaussian
subspaces of the same rank. With P the orthogonal projector on a subspace U (orthonormal basis, d x k):

- energy_share(U) = sum_t ||P g_t||^2 / sum_t ||g_t||^2 = tr(U^T M U) / tr(M), M = sum_t g_t g_t^T, over
  EVERY valid token of the stratum (exact, from M). Chance level for a random subspace: k / d.
- anisotropy_share(U) = sum_{i<=m} lambda_i ||P v_i||^2 / sum_{i<=m} lambda_i, (lambda_i, v_i) the top m = k
  eigenpairs of the gradients' centred covariance C = M / n - mu mu^T: how much of the gradient's
  dominant-direction variance the subspace holds. Chance level: k / d.

Each share comes with z = (share - null_mean) / null_sd against the exact null of a uniformly random subspace
of the same rank (null_mean = k / d, null_sd in closed form: anisweep.tangent.shares.null_moments), and, as a
check, the `n_random` sampled controls' mean and sd (ddof=1; subspace `random`). Strata: tokens
by the count of their token id in the evaluation batch (frequent, middle, rare: see `frequency_strata`).

The subspaces are fitted per checkpoint on that checkpoint's activations (rows with fit = "checkpoint") and,
with `subspaces: fixed | both`, also held fixed: fitted once per model on extract's hidden-state samples of an
early window of steps (anisweep.tangent.fixed; rows with fit = "fixed", one table per model: `fixed_shares`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from anisweep.tangent.seminmf import orthonormal_basis, semi_nmf
from anisweep.tangent.settings import GradientSettings
from anisweep.tangent.shares import control_bases, isotropy_rows, reference_bases, share_rows
from anisweep.tangent.sums import GradientPass


def _fixed_bases_of(fixed: dict, key: tuple[int, str], rank: int, d_model: int) -> dict[str, np.ndarray]:
    bases = fixed.get((*key, rank))
    if bases is None:
        raise ValueError(
            f"gradients: the fixed subspaces have no basis for layer {key[0]} {key[1]} at rank {rank}; "
            "refit them with the same gradients.layers, final_ln and rank (delete gradient_fixed_bases.parquet)"
        )
    for name, basis in bases.items():
        if basis.shape[0] != d_model:
            raise ValueError(
                f"gradients: the fixed {name} basis of layer {key[0]} {key[1]} is {basis.shape[0]}-d, not {d_model}"
            )
    return bases


def _check_rank(rank: int, d_model: int, n_sampled: int) -> None:
    if rank >= d_model or rank > n_sampled:
        raise ValueError(
            f"gradients.rank {rank} must be less than d_model = {d_model} (a rank-d subspace is the whole space: "
            f"every share is 1) and at most the {n_sampled} sampled tokens; lower gradients.rank or raise "
            "gradients.sample_tokens"
        )


def _finite_sample(result: GradientPass, key: tuple[int, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    act, grad = result.act_sample[key], result.grad_sample[key]
    finite = np.isfinite(act).all(1) & np.isfinite(grad).all(1)
    return act[finite], grad[finite], result.sample_strata[finite]


def checkpoint_rows(
    result: GradientPass,
    settings: GradientSettings,
    d_model: int,
    progress: bool = True,
    bases_out: dict | None = None,
) -> pl.DataFrame:
    """The rows of gradients.parquet that depend on this checkpoint alone: per site and rank the subspaces fitted
    on its activations (their fit's quality; their shares, fit = "checkpoint", unless gradients.subspaces is
    fixed), the isotropy of activations and gradients, and the LM loss. `bases_out`, when given, receives the
    orthonormal bases as {(layer, site, rank): {"seminmf": U, "pca": U, "pca_uncentred": U}}."""
    rows = []
    per_checkpoint = settings.subspaces != "fixed"
    for key in tqdm(sorted(result.sums), desc="subspaces", unit="site", disable=not progress, leave=False):
        layer, site = key
        act, grad, strata = _finite_sample(result, key)
        where = {"layer": layer, "site": site}
        for rank in settings.ranks():
            _check_rank(rank, d_model, len(act))
            fit = semi_nmf(act, rank, seed=settings.seed, max_iter=settings.max_iter)
            bases = {"seminmf": orthonormal_basis(fit.F), **reference_bases(act, rank)}
            if bases_out is not None:
                bases_out[(*key, rank)] = bases
            if per_checkpoint:
                controls = control_bases(d_model, rank, settings.n_random, settings.seed + rank)
                for row in share_rows(bases, controls, result.sums[key], rank):
                    rows.append({**where, **row, "fit": "checkpoint", "chance": rank / d_model})
            centred = act - act.mean(0)
            fit_rows = {
                "seminmf": {
                    "fit_error": fit.error,
                    "fit_iterations": fit.iterations,
                    "fit_converged": float(fit.converged),
                    "dim": bases["seminmf"].shape[1],
                },
                "pca": {"explained_variance": _captured(centred, bases["pca"]), "dim": rank},
                "pca_uncentred": {"explained_energy": _captured(act, bases["pca_uncentred"]), "dim": rank},
            }
            for subspace, values in fit_rows.items():
                rows += [
                    {
                        **where,
                        "stratum": "all",
                        "subspace": subspace,
                        "fit": "checkpoint",
                        "rank": rank,
                        "measure": m,
                        "value": float(v),
                    }
                    for m, v in values.items()
                ]
        rows += [{**where, **row} for row in isotropy_rows(result.sums[key], act, grad, strata, d_model)]
    lm = {"loss": result.loss, "n_targets": result.n_targets, **result.strata_info}
    rows += [{"layer": None, "site": "lm", "stratum": "all", "measure": m, "value": v} for m, v in lm.items()]
    return pl.DataFrame(rows, schema=GRADIENT_SCHEMA)


def _captured(x: np.ndarray, basis: np.ndarray) -> float:
    """The share of x's squared norm in the span of an orthonormal basis."""
    return float(np.linalg.norm(x @ basis) ** 2 / np.linalg.norm(x) ** 2)


def fixed_rows(sums: dict, fixed: dict, settings: GradientSettings) -> pl.DataFrame:
    """The shares of every site's gradients (`sums`: {(layer, site): SiteSums}) in the subspaces held fixed
    (`fixed`: {(layer, site, rank): {subspace: U}}, anisweep.tangent.fixed), fit = "fixed", against the same
    random controls as the per-checkpoint fits."""
    rows = []
    for key in sorted(sums):
        d_model = sums[key].d
        for rank in settings.ranks():
            controls = control_bases(d_model, rank, settings.n_random, settings.seed + rank)
            bases = _fixed_bases_of(fixed, key, rank, d_model)
            for row in share_rows(bases, controls, sums[key], rank):
                rows.append({"layer": key[0], "site": key[1], **row, "fit": "fixed", "chance": rank / d_model})
    return pl.DataFrame(rows, schema=GRADIENT_SCHEMA)


def analyse(
    result: GradientPass,
    settings: GradientSettings,
    d_model: int,
    progress: bool = True,
    fixed: dict | None = None,
    bases_out: dict | None = None,
) -> pl.DataFrame:
    """Every row of gradients.parquet (without the identity columns) from a gradient pass: `checkpoint_rows`,
    and with `gradients.subspaces` fixed or both the `fixed_rows` of `fixed` (which must then be given)."""
    table = checkpoint_rows(result, settings, d_model, progress, bases_out)
    if settings.subspaces == "per_checkpoint":
        return table
    if fixed is None:
        raise ValueError(
            "gradients.subspaces asks for fixed subspaces but none were given: the workflow fits them per model "
            "(rule gradient_fixed_bases); in Python pass fixed=anisweep.tangent.fixed.read_fixed_bases(path)"
        )
    return pl.concat([table, fixed_rows(result.sums, fixed, settings)])


GRADIENT_SCHEMA = {
    "layer": pl.Int64,
    "site": pl.String,
    "stratum": pl.String,
    "subspace": pl.String,
    "fit": pl.String,  # "checkpoint": fitted on this checkpoint's activations; "fixed": on an early window
    "rank": pl.Int64,
    "measure": pl.String,
    "value": pl.Float64,
    "control_mean": pl.Float64,
    "control_sd": pl.Float64,
    "null_mean": pl.Float64,  # the exact null of a uniformly random subspace of the same rank (shares.null_moments)
    "null_sd": pl.Float64,
    "z": pl.Float64,  # (value - null_mean) / null_sd
    "chance": pl.Float64,
    "n_tokens": pl.Int64,
}


def _read_pass(sums: str | Path, sample: str | Path | None = None) -> tuple[GradientPass, dict]:
    from anisweep.tables import IDENTITY, read_parquet
    from anisweep.tangent.pass_tables import SAMPLE_SCHEMA, read_pass

    sums_table = read_parquet(sums)
    sample_table = read_parquet(sample) if sample else pl.DataFrame(schema=SAMPLE_SCHEMA)
    ident = sums_table.select(IDENTITY).row(0, named=True) if sums_table.height else {}
    return read_pass(sums_table, sample_table, where=str(sums)), ident


def checkpoint_shares(
    sums: str | Path, sample: str | Path, settings: GradientSettings, out: str | Path, bases_out: str | None = None
) -> None:
    """The gradients rule: gradients.parquet of one checkpoint from its pass tables (`checkpoint_rows`); with
    `bases_out` also its layer-0 bases for the embedding-change alignment."""
    from anisweep.tables import with_identity, write_atomic
    from anisweep.tangent.fixed import bases_frame

    result, ident = _read_pass(sums, sample)
    d_model = next(iter(result.sums.values())).d
    bases: dict = {}
    table = checkpoint_rows(result, settings, d_model, bases_out=bases)
    if bases_out:
        layer0 = {key: value for key, value in bases.items() if key[:2] == (0, "resid")}
        if not layer0:
            raise ValueError("gradients.embedding_change needs the embedding-output site: put 0 in gradients.layers")
        write_atomic(bases_frame(layer0), bases_out)
    write_atomic(with_identity(table, ident), out)


def fixed_shares(sums: list[str | Path], fixed_bases: str | Path, settings: GradientSettings, out: str | Path) -> None:
    """The gradient_fixed_shares rule: every analysed checkpoint's shares in its model's fixed subspaces
    (`fixed_rows`), one table with identity columns, in step order, each row naming the fit window (`window`)."""
    from anisweep.tables import read_parquet, with_identity, write_atomic
    from anisweep.tangent.fixed import bases_from_frame, window_of

    frame = read_parquet(fixed_bases)
    fixed, window = bases_from_frame(frame), pl.lit(window_of(frame), pl.String).alias("window")
    tables = []
    for path in sums:
        result, ident = _read_pass(path)
        tables.append(with_identity(fixed_rows(result.sums, fixed, settings), ident).with_columns(window))
    write_atomic(pl.concat(tables).sort("step", "layer", "site", "rank", "subspace", "stratum", "measure"), out)
