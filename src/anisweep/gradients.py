"""Tangent-aligned anisotropy: does the true LM-loss gradient live in low-rank subspaces fitted to the
activations (seeds 000/001)?

One backward pass of the model's own LM loss over the evaluation batch (masked LM, 15% of non-special tokens
seeded, 80/10/10 as in training, for encoders; next-token loss for decoders), with the gradient of the loss
(the mean over every target of the batch) with respect to the residual stream at a few sites. Per site, the
pass keeps only float64 sums (per frequency stratum: the gradients' second-moment matrix, mean and unit-vector
sums; the activations' unit-vector sums) and a seeded sample of tokens (activations and gradients).

Per site, rank-k subspaces are fitted to the sampled activations: semi-NMF (anisweep.seminmf, the "tangent
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
early window of steps (anisweep.gradient_subspaces; rows with fit = "fixed").
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from . import config, geometry
from .recorder import Sample, first_tensor
from .seminmf import orthonormal_basis, semi_nmf

if TYPE_CHECKING:
    from .adapters import Adapter

_DEFAULTS = config.defaults("gradients")
STRATA = ("all", "frequent", "middle", "rare")
SUBSPACES = ("seminmf", "pca")


@dataclass
class GradientSettings:
    """The config's `gradients` section; the defaults are the schema's (anisweep/config.schema.yaml)."""

    enabled: bool = _DEFAULTS["enabled"]
    layers: list[int] | None = _DEFAULTS["layers"]  # residual-stream layers; None: 0, n_layers // 2 (and n_layers)
    final_ln: bool = _DEFAULTS["final_ln"]
    rank: int | list[int] = _DEFAULTS["rank"]
    n_random: int = _DEFAULTS["n_random"]
    sample_tokens: int = _DEFAULTS["sample_tokens"]
    mlm_probability: float = _DEFAULTS["mlm_probability"]
    max_iter: int = _DEFAULTS["max_iter"]
    seed: int = _DEFAULTS["seed"]
    steps: list[int] | None = _DEFAULTS["steps"]
    subspaces: str = _DEFAULTS["subspaces"]  # per_checkpoint | fixed | both
    fit_window: list[int] | None = _DEFAULTS["fit_window"]
    embedding_change: bool = _DEFAULTS["embedding_change"]
    embedding_tokens: int = _DEFAULTS["embedding_tokens"]

    def ranks(self) -> list[int]:
        return sorted({self.rank} if isinstance(self.rank, int) else set(self.rank))


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


# --------------------------------------------------------------------------- sites and strata
@dataclass(frozen=True)
class GradientSite:
    layer: int
    site: str  # "resid", "final_ln_in", "final_ln_out"
    module: nn.Module
    reads: str  # "output" or "input" of the module


def gradient_sites(adapter: Adapter, base: nn.Module, n_layers: int, settings: GradientSettings) -> list[GradientSite]:
    """The residual-stream modules at the configured layers, and the final LayerNorm's input and output."""
    # By default the last layer is read through the final LayerNorm's sites, one of which it equals.
    default = {0, n_layers // 2} if settings.final_ln else {0, n_layers // 2, n_layers}
    layers = settings.layers if settings.layers is not None else sorted(default)
    resid = {site.layer: site.module for site in adapter.resid_sites(base)}
    unknown = sorted(set(layers) - set(resid))
    if unknown:
        raise ValueError(
            f"gradients.layers: {unknown} are not residual-stream layers of this model (0 = embedding output, "
            f"1..{n_layers} = block outputs)"
        )
    sites = [GradientSite(layer, "resid", resid[layer], "output") for layer in layers]
    if settings.final_ln:
        final = [s for s in adapter.layernorm_sites(base) if s.site == "final_ln"]
        for s in final:
            sites += [GradientSite(s.layer, "final_ln_in", s.module, "input")]
            sites += [GradientSite(s.layer, "final_ln_out", s.module, "output")]
    return sites


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


# --------------------------------------------------------------------------- the pass and its sums
@dataclass
class SiteSums:
    """float64 sums over the valid tokens of one site per frequency stratum, accumulated on the model's device;
    `finish()` gives them as numpy arrays indexed by STRATA (`all` being the strata's sum)."""

    d: int
    device: torch.device | str = "cpu"
    n: np.ndarray = field(init=False)
    grad_sum: np.ndarray = field(init=False)
    grad_second: np.ndarray = field(init=False)
    grad_unit: np.ndarray = field(init=False)
    act_unit: np.ndarray = field(init=False)
    grad_norm: np.ndarray = field(init=False)

    def __post_init__(self):
        zeros = lambda *shape: torch.zeros(3, *shape, dtype=torch.float64, device=self.device)  # noqa: E731
        self._sums = {
            "n": zeros(),
            "grad_sum": zeros(self.d),
            "grad_second": zeros(self.d, self.d),
            "grad_unit": zeros(self.d),
            "act_unit": zeros(self.d),
            "grad_norm": zeros(),
        }

    def add(self, act: torch.Tensor, grad: torch.Tensor, stratum: torch.Tensor) -> None:
        """act, grad: (n, d) of valid tokens; stratum (n,) in 0..2 (0 frequent, 1 middle, 2 rare)."""
        a, g = act.double(), grad.double()
        stratum = stratum.to(g.device)
        g_norm = g.norm(dim=1, keepdim=True)
        g_unit = g / g_norm.clamp_min(1e-300)
        a_unit = a / a.norm(dim=1, keepdim=True).clamp_min(1e-300)
        sums = self._sums
        for index in range(3):
            rows = stratum == index
            gs = g[rows]
            sums["n"][index] += gs.shape[0]
            sums["grad_sum"][index] += gs.sum(0)
            sums["grad_second"][index] += gs.T @ gs
            sums["grad_unit"][index] += g_unit[rows].sum(0)
            sums["act_unit"][index] += a_unit[rows].sum(0)
            sums["grad_norm"][index] += g_norm[rows].sum()

    def finish(self) -> SiteSums:
        for name, value in self._sums.items():
            per_stratum = value.cpu().numpy()
            setattr(self, name, np.concatenate([per_stratum.sum(0, keepdims=True), per_stratum]))
        self.n = self.n.astype(np.int64)
        return self


@dataclass
class GradientPass:
    """What the pass keeps: per site the sums and the sampled tokens' activations and gradients."""

    sites: list[GradientSite]
    sums: dict[tuple[int, str], SiteSums]
    act_sample: dict[tuple[int, str], np.ndarray]
    grad_sample: dict[tuple[int, str], np.ndarray]
    sample_strata: np.ndarray
    loss: float
    n_targets: int
    strata_info: dict
    seconds: float


def _capture(sites: list[GradientSite], captured: dict):
    handles = []
    for site in sites:
        key = (site.layer, site.site)
        if site.reads == "output":
            hook = lambda m, a, o, key=key: captured.__setitem__(key, first_tensor(o))  # noqa: E731
        else:
            hook = lambda m, a, o, key=key: captured.__setitem__(key, a[0])  # noqa: E731
        handles.append(site.module.register_forward_hook(hook))
    return handles


def gradient_pass(
    model: nn.Module,
    adapter: Adapter,
    d_model: int,
    n_layers: int,
    lm: LMBatch,
    settings: GradientSettings,
    batch_size: int,
    progress: bool = True,
) -> GradientPass:
    """Stream the batch through the LM in mini-batches; per mini-batch one backward of (its share of) the mean
    loss over every target of the batch, to the residual-stream sites only (torch.autograd.grad: no
    parameter's .grad is touched). The model is put in eval mode and given back in the mode it had."""
    device = next(model.parameters()).device
    base = adapter.base_model(model)
    sites = gradient_sites(adapter, base, n_layers, settings)
    strata, strata_info = frequency_strata(lm.token_ids, lm.valid)
    sample = Sample.draw(lm.token_ids, lm.valid, settings.sample_tokens, settings.seed)
    sample_strata = strata[sample.seq, sample.position].numpy()
    sums = {(s.layer, s.site): SiteSums(d_model, device) for s in sites}
    act_sample = {key: np.zeros((len(sample.seq), d_model), np.float32) for key in sums}
    grad_sample = {key: np.zeros((len(sample.seq), d_model), np.float32) for key in sums}
    n_targets = lm.n_targets
    if n_targets == 0:
        raise ValueError("gradients: the evaluation batch has no LM target (sequences of one token?)")
    was_training = model.training
    model.eval()
    captured: dict = {}
    handles = _capture(sites, captured)
    total_loss, started = 0.0, time.perf_counter()
    try:
        starts = range(0, lm.input_ids.shape[0], batch_size)
        for start in tqdm(starts, desc="gradients", unit="batch", disable=not progress, leave=False):
            rows = slice(start, start + batch_size)
            ids, valid = lm.input_ids[rows].to(device), lm.valid[rows].to(device)
            labels = lm.labels[rows].to(device)
            captured.clear()
            with torch.enable_grad():
                logits = lm_logits(model(input_ids=ids, attention_mask=valid.long()))
                loss = nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
                ) / float(n_targets)
                keys = list(captured)
                unique = list({id(captured[k]): captured[k] for k in keys}.values())
                grads = torch.autograd.grad(loss, unique, allow_unused=True)
            by_id = {id(t): (t, gr) for t, gr in zip(unique, grads, strict=True)}
            total_loss += float(loss.detach())
            flat_valid = valid.reshape(-1)
            batch_strata = strata[rows].reshape(-1).to(device)[flat_valid]
            in_batch = (sample.seq >= start) & (sample.seq < start + ids.shape[0])
            flat_index = ((sample.seq[in_batch] - start) * ids.shape[1] + sample.position[in_batch]).to(device)
            for key in keys:
                tensor, grad = by_id[id(captured[key])]
                act = tensor.detach().float().reshape(-1, d_model)
                grad = torch.zeros_like(act) if grad is None else grad.float().reshape(-1, d_model)
                sums[key].add(act[flat_valid], grad[flat_valid], batch_strata)
                act_sample[key][in_batch.numpy()] = act[flat_index].cpu().numpy()
                grad_sample[key][in_batch.numpy()] = grad[flat_index].cpu().numpy()
            del logits, loss, grads, by_id
            captured.clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return GradientPass(
        sites,
        {key: value.finish() for key, value in sums.items()},
        act_sample,
        grad_sample,
        sample_strata,
        total_loss,
        n_targets,
        strata_info,
        time.perf_counter() - started,
    )


# --------------------------------------------------------------------------- subspaces and shares
def pca_basis(x: np.ndarray, rank: int) -> np.ndarray:
    """The top-`rank` principal axes (d, rank) of the centred rows of x."""
    x = np.asarray(x, np.float64)
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    return vt[:rank].T


def random_bases(d: int, rank: int, n: int, seed: int) -> list[np.ndarray]:
    """`n` orthonormal bases of seeded Gaussian rank-`rank` subspaces of R^d (uniform on the Grassmannian)."""
    rng = np.random.default_rng(seed)
    return [np.linalg.qr(rng.standard_normal((d, rank)))[0] for _ in range(n)]


def energy_share(basis: np.ndarray, second_moment: np.ndarray) -> float:
    """tr(U^T M U) / tr(M) = sum_t ||P g_t||^2 / sum_t ||g_t||^2 for M = sum_t g_t g_t^T."""
    total = float(np.trace(second_moment))
    return float(np.einsum("ij,ik,kj->", basis, second_moment, basis) / total) if total > 0 else float("nan")


def top_eigenpairs(covariance: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The m largest eigenvalues (clipped at 0, descending) and their eigenvectors (d, m)."""
    values, vectors = np.linalg.eigh(covariance)
    order = np.argsort(values)[::-1][:m]
    return np.clip(values[order], 0.0, None), vectors[:, order]


def anisotropy_share(basis: np.ndarray, values: np.ndarray, vectors: np.ndarray) -> float:
    """sum_i lambda_i ||U^T v_i||^2 / sum_i lambda_i over the given top eigenpairs of the gradient covariance."""
    total = float(values.sum())
    captured = ((basis.T @ vectors) ** 2).sum(0)
    return float(values @ captured / total) if total > 0 else float("nan")


def _controls(value: float, controls: np.ndarray) -> dict:
    mean, sd = float(controls.mean()), float(controls.std(ddof=1)) if len(controls) > 1 else float("nan")
    z = (value - mean) / sd if sd > 0 else float("nan")
    return {"control_mean": mean, "control_sd": sd, "z": z}


def _moments(sums: SiteSums, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(second moment M, centred covariance C) of stratum `index`'s gradients."""
    n = max(int(sums.n[index]), 1)
    mean = sums.grad_sum[index] / n
    return sums.grad_second[index], sums.grad_second[index] / n - np.outer(mean, mean)


def share_rows(bases: dict[str, np.ndarray], controls: list[np.ndarray], sums: SiteSums, rank: int) -> list[dict]:
    """energy_share and anisotropy_share of each fitted basis, per stratum, against the random controls."""
    rows = []
    for index, stratum in enumerate(STRATA):
        if sums.n[index] < 2:
            continue
        second, covariance = _moments(sums, index)
        values, vectors = top_eigenpairs(covariance, rank)
        measures = {
            "energy_share": lambda u, second=second: energy_share(u, second),
            "anisotropy_share": lambda u, values=values, vectors=vectors: anisotropy_share(u, values, vectors),
        }
        for measure, share in measures.items():
            control_values = np.array([share(u) for u in controls])
            for subspace, basis in bases.items():
                value = share(basis)
                rows.append(
                    {
                        "stratum": stratum,
                        "subspace": subspace,
                        "rank": rank,
                        "measure": measure,
                        "value": value,
                        "n_tokens": int(sums.n[index]),
                        **_controls(value, control_values),
                    }
                )
            rows.append(
                {
                    "stratum": stratum,
                    "subspace": "random",
                    "rank": rank,
                    "measure": measure,
                    "value": float(control_values.mean()),
                    "n_tokens": int(sums.n[index]),
                    "control_mean": float(control_values.mean()),
                    "control_sd": float(control_values.std(ddof=1)) if len(control_values) > 1 else float("nan"),
                    "z": 0.0,
                }
            )
    return rows


def isotropy_rows(sums: SiteSums, act: np.ndarray, grad: np.ndarray, sample_strata: np.ndarray, d: int) -> list[dict]:
    """Per stratum: avg_cos of activations and gradients over every valid token (exact, from the unit sums),
    IsoScore on the sampled tokens (NaN where the stratum has fewer sampled tokens than d), mean gradient norm."""
    rows = []
    for index, stratum in enumerate(STRATA):
        n = int(sums.n[index])
        keep = np.ones(len(act), bool) if index == 0 else sample_strata == index - 1
        values = {
            "act_avg_cos": geometry.avg_cos_from_sums(sums.act_unit[index], n),
            "grad_avg_cos": geometry.avg_cos_from_sums(sums.grad_unit[index], n),
            "grad_norm_mean": sums.grad_norm[index] / n if n else float("nan"),
            "act_isoscore": geometry.isoscore(act[keep]) if keep.sum() >= d else float("nan"),
            "grad_isoscore": geometry.isoscore(grad[keep]) if keep.sum() >= d else float("nan"),
            "n_sampled": int(keep.sum()),
        }
        rows += [{"stratum": stratum, "measure": m, "value": float(v), "n_tokens": n} for m, v in values.items()]
    return rows


def _fixed_bases_of(fixed: dict | None, key: tuple[int, str], rank: int, d_model: int) -> dict[str, np.ndarray]:
    if fixed is None:
        raise ValueError(
            "gradients.subspaces asks for fixed subspaces but none were given: the workflow fits them per model "
            "(rule gradient_fixed_bases); in Python pass fixed=anisweep.gradient_subspaces.read_fixed_bases(path)"
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

    `fixed`: {(layer, site, rank): {"seminmf": U, "pca": U}} held-fixed bases (anisweep.gradient_subspaces), whose
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


# --------------------------------------------------------------------------- one checkpoint
def load_lm(path, dtype: str = "float32", device: torch.device | str = "cpu"):
    """The checkpoint's LM class (as extract.load_model picks it) with its head, standard attention."""
    import transformers

    from .adapters import adapter_for
    from .extract import DTYPES

    hf_config = transformers.AutoConfig.from_pretrained(path)
    adapter = adapter_for(hf_config)
    arch = (hf_config.architectures or [None])[0]
    if arch not in adapter.architectures:
        raise ValueError(
            f"gradients: {path} is a {arch}, not one of {adapter.architectures}: no LM head to take a loss"
        )
    model = getattr(transformers, arch).from_pretrained(path, dtype=DTYPES[dtype], attn_implementation="sdpa")
    if model.get_output_embeddings() is None:
        raise ValueError(
            f"gradients: {path} is a {arch}, without an LM head: the gradient of the LM loss needs the checkpoint's "
            "LM class (e.g. BertForMaskedLM, GPTNeoXForCausalLM); set gradients.enabled: false for it"
        )
    return model.to(device).eval(), adapter


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
    (anisweep.embedding_change)."""
    from . import embedding_change, preflight
    from .gradient_subspaces import bases_frame, read_fixed_bases
    from .tables import with_identity, write_atomic

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
