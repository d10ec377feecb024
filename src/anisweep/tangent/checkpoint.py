"""Tangent-aligned anisotropy: does the true LM-loss gradient live in low-rank subspaces fitted to the
activations (seeds 000/001)?

One backward pass of the model's own LM loss over the evaluation batch (masked LM, 15% of non-special tokens
seeded, 80/10/10 as in training, for encoders; next-token loss for decoders), with the gradient of the loss
(the mean over every target of the batch) with respect to the residual stream at a few sites. Per site, the
pass keeps only float64 sums (per frequency stratum: the gradients' second-moment matrix, mean and unit-vector
sums; the activations' unit-vector sums) and a seeded sample of tokens (activations and gradients).

Per site, rank-k subspaces are fitted to the sampled activations: semi-NMF (anisweep.tangent.seminmf, the "tangent
proxies") and PCA (top-k principal axes of the centred activations), against `n_random` seeded Gaussian
subspaces of the same rank. With P the orthogonal projector on a subspace U (orthonormal basis, d x k):

- energy_share(U) = sum_t ||P g_t||^2 / sum_t ||g_t||^2 = tr(U^T M U) / tr(M), M = sum_t g_t g_t^T, over
  EVERY valid token of the stratum (exact, from M). Chance level for a random subspace: k / d.
- anisotropy_share(U) = sum_{i<=m} lambda_i ||P v_i||^2 / sum_{i<=m} lambda_i, (lambda_i, v_i) the top m = k
  eigenpairs of the gradients' centred covariance C = M / n - mu mu^T: how much of the gradient's
  dominant-direction variance the subspace holds. Chance level: k / d.

Each share comes with the random controls' mean and sd (ddof=1) and z = (share - mean) / sd. Strata: tokens
by the count of their token id in the evaluation batch (frequent, middle, rare: see `frequency_strata`).

The subspaces are fitted per checkpoint on that checkpoint's activations (rows with fit = "checkpoint") and,
with `subspaces: fixed | both`, also held fixed: fitted once per model on extract's hidden-state samples of an
early window of steps (anisweep.tangent.fixed; rows with fit = "fixed").
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from anisweep.tangent.seminmf import orthonormal_basis, semi_nmf

if TYPE_CHECKING:
    from anisweep.adapters import Adapter

from anisweep.tangent.backward import GradientPass, gradient_pass, load_lm
from anisweep.tangent.batch import lm_batch
from anisweep.tangent.settings import GradientSettings
from anisweep.tangent.shares import isotropy_rows, pca_basis, random_bases, share_rows


def _fixed_bases_of(fixed: dict | None, key: tuple[int, str], rank: int, d_model: int) -> dict[str, np.ndarray]:
    if fixed is None:
        raise ValueError(
            "gradients.subspaces asks for fixed subspaces but none were given: the workflow fits them per model "
            "(rule gradient_fixed_bases); in Python pass fixed=anisweep.tangent.fixed.read_fixed_bases(path)"
        )
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


def analyse(
    result: GradientPass,
    settings: GradientSettings,
    d_model: int,
    progress: bool = True,
    fixed: dict | None = None,
    bases_out: dict | None = None,
) -> pl.DataFrame:
    """Every row of gradients.parquet (without the identity columns) from a gradient pass.

    `fixed`: {(layer, site, rank): {"seminmf": U, "pca": U}} held-fixed bases (anisweep.tangent.fixed), whose
    shares are added with fit = "fixed". `bases_out`, when given, receives the per-checkpoint orthonormal bases as
    {(layer, site, rank): {"seminmf": U, "pca": U}}."""
    rows = []
    per_checkpoint = settings.subspaces != "fixed"
    keys = sorted(result.sums)
    for key in tqdm(keys, desc="subspaces", unit="site", disable=not progress, leave=False):
        layer, site = key
        act, grad = result.act_sample[key], result.grad_sample[key]
        finite = np.isfinite(act).all(1) & np.isfinite(grad).all(1)
        act, grad, strata = act[finite], grad[finite], result.sample_strata[finite]
        where = {"layer": layer, "site": site}
        for rank in settings.ranks():
            if rank > min(act.shape):
                raise ValueError(
                    f"gradients.rank {rank} is larger than d_model = {d_model} or the {len(act)} sampled tokens; "
                    "lower gradients.rank or raise gradients.sample_tokens"
                )
            fit = semi_nmf(act, rank, seed=settings.seed, max_iter=settings.max_iter)
            pca = pca_basis(act, rank)
            bases = {"seminmf": orthonormal_basis(fit.F), "pca": pca}
            if bases_out is not None:
                bases_out[(*key, rank)] = bases
            controls = random_bases(d_model, rank, settings.n_random, settings.seed + rank)
            by_fit = {"checkpoint": bases} if per_checkpoint else {}
            if settings.subspaces != "per_checkpoint":
                by_fit["fixed"] = _fixed_bases_of(fixed, key, rank, d_model)
            for fit_name, fitted in by_fit.items():
                for row in share_rows(fitted, controls, result.sums[key], rank):
                    rows.append({**where, **row, "fit": fit_name, "chance": rank / d_model})
            centred = act - act.mean(0)
            explained = float((np.linalg.norm(centred @ pca) ** 2) / np.linalg.norm(centred) ** 2)
            fit_rows = {
                "seminmf": {"fit_error": fit.error, "fit_iterations": fit.iterations, "dim": bases["seminmf"].shape[1]},
                "pca": {"explained_variance": explained, "dim": rank},
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
    rows.append({"layer": None, "site": "lm", "stratum": "all", "measure": "loss", "value": result.loss})
    rows.append({"layer": None, "site": "lm", "stratum": "all", "measure": "n_targets", "value": result.n_targets})
    # the pass's time goes to the log, not the table: a rerun writes the same bytes, so nothing downstream reruns
    print(f"gradients: backward pass {result.seconds:.2f} s", file=sys.stderr)
    rows += [
        {"layer": None, "site": "lm", "stratum": "all", "measure": m, "value": v} for m, v in result.strata_info.items()
    ]
    return pl.DataFrame(rows, schema=GRADIENT_SCHEMA)


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
    "z": pl.Float64,
    "chance": pl.Float64,
    "n_tokens": pl.Int64,
}


def analyse_model(
    model: nn.Module,
    adapter: Adapter,
    batch: dict,
    tokenizer,
    settings: GradientSettings,
    batch_size: int,
    progress: bool = True,
    fixed: dict | None = None,
    bases_out: dict | None = None,
) -> pl.DataFrame:
    """The gradient pass and every share, of a model in memory (a checkpoint, or a model being trained).
    `fixed` and `bases_out` as in `analyse`."""
    geometry_ = adapter.geometry(model.config)
    masking = {"probability": settings.mlm_probability, "seed": settings.seed}
    vocab = model.get_output_embeddings().weight.shape[0]
    lm = lm_batch(batch, geometry_.causal, tokenizer, vocab_size=vocab, **masking)
    result = gradient_pass(model, adapter, geometry_.d_model, geometry_.n_layers, lm, settings, batch_size, progress)
    return analyse(result, settings, geometry_.d_model, progress, fixed=fixed, bases_out=bases_out)


def gradients_checkpoint(
    manifest: dict,
    texts: list[str],
    extract_settings,
    settings: GradientSettings,
    out: str,
    fixed_bases: str | None = None,
    bases_out: str | None = None,
    embeddings_out: str | None = None,
) -> None:
    """Load the checkpoint a fetch manifest names, run the gradient analysis on extract's evaluation batch
    (same texts, seq_len, n_sequences and seed), write gradients.parquet; with `fixed_bases` (the model's
    gradient_fixed_bases.parquet) also the shares in the fixed subspaces; with `bases_out` and `embeddings_out`
    the layer-0 bases and the kept token-embedding rows the embedding-change alignment reads
    (anisweep.tangent.embedding_change)."""
    from anisweep.checkpoints import preflight
    from anisweep.tables import with_identity, write_atomic
    from anisweep.tangent import embedding_change
    from anisweep.tangent.fixed import bases_frame, read_fixed_bases

    if extract_settings.threads:
        torch.set_num_threads(extract_settings.threads)
    where = f"{manifest['family']}/{manifest['model']}/step{manifest['step']}"
    batch = preflight.evaluation_batch(manifest["path"], manifest.get("tokenizer_path"), extract_settings, texts, where)
    tokenizer = preflight.load_tokenizer(manifest.get("tokenizer_path"), manifest["path"], where)
    model, adapter = load_lm(manifest["path"], extract_settings.dtype, extract_settings.torch_device())
    fixed = read_fixed_bases(fixed_bases) if fixed_bases else None
    bases: dict = {}
    table = analyse_model(
        model, adapter, batch, tokenizer, settings, extract_settings.batch_size, fixed=fixed, bases_out=bases
    )
    ident = {key: manifest.get(key) for key in ("family", "model", "seed", "step", "tokens_seen")}
    if bases_out:
        layer0 = {key: value for key, value in bases.items() if key[:2] == (0, "resid")}
        if not layer0:
            raise ValueError("gradients.embedding_change needs the embedding-output site: put 0 in gradients.layers")
        write_atomic(bases_frame(layer0), bases_out)
    if embeddings_out:
        kept = embedding_change.sample_ids(
            batch["input_ids"], batch["attention_mask"].bool(), settings.embedding_tokens, settings.seed
        )
        weights = model.get_input_embeddings().weight.detach().float().cpu().numpy()
        write_atomic(embedding_change.embedding_rows(weights, kept), embeddings_out)
    write_atomic(with_identity(table, ident), out)
