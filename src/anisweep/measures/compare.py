"""Comparative measures: a measure of a pair of checkpoints, per layer and site, on their shared sample of tokens.

They read the two checkpoints' hidden.parquet (never a model). The rows of one (layer, site) are the sampled tokens
ordered by (seq, position); the two checkpoints are compared only where they hold the same tokens: the same
(seq, position, token_id) at every row, else a ComparisonError says which (layer, site) differs and why (another
evaluation batch, sample size or seed, another tokenizer).

Built in (docs/measures.md, Comparative measures):

- `cka`: linear CKA (anisweep.measures.cka, from d x d cross-products; `cka_debiased` with the unbiased HSIC);
- `svcca`: Raghu et al. 2017: each side reduced to its top principal directions that explain `svcca_variance` of its
  variance, then the mean of the canonical correlations of the two reductions;
- `pwcca`: Morcos et al. 2018: the canonical correlations weighted by how much of the representation each canonical
  direction accounts for.

SVCCA and PWCCA cost d^3 per layer (eigen-decompositions and an SVD of d x d matrices), CKA n d^2 (its products):
above `cca_max_width` dimensions (the wider side's) a layer gets CKA alone unless the config asks for more
(docs/performance.md, The comparisons at large widths).

SVCCA and PWCCA compute what google/svcca's cca_core.get_cca_similarity and pwcca.compute_pwcca compute (epsilon 0),
from the d x d cross-products alone (one set per layer, shared with CKA, and one eigen-decomposition per side shared
by SVCCA and PWCCA), never an n x n matrix nor, for PWCCA's weights, the reference's n x d QR. On principal
coordinates (a side of less than full rank, below) PWCCA equals the reference's only where the checkpoint keeps no
more of them than the reference: with more, the reference's pwcca.py raises IndexError.

A sample of less than full rank (a LayerNorm's output lies in a hyperplane) holds principal directions whose spread
is the rounding of the stored values, which CCA would whiten into canonical correlations of noise: a side with a
principal direction at or below its rounding floor (`CrossProducts.floor`, from `rounding_bound`: extract's dtype and
extract.sample_precision's storage) enters CCA as its principal coordinates above it (centred), and a CCA whose
correlations still exceed 1 is NaN with the reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl
from scipy.linalg import solve_triangular

from anisweep.measures.cka import Features, cka_matrix, hsic
from anisweep.sample_storage import outliers, precision_of
from anisweep.tables import IDENTITY, read_parquet

#: The built-in comparative measures, in the order their rows are written.
BUILTIN_COMPARATIVE = ("cka", "svcca", "pwcca")
#: The columns of a pair's table (compare/*.parquet): the checkpoint's identity, the reference's, where and what.
PAIR_SCHEMA = {
    "family": pl.String,
    "model": pl.String,
    "seed": pl.Int64,
    "step": pl.Int64,
    "tokens_seen": pl.Int64,
    "ref_model": pl.String,
    "ref_seed": pl.Int64,
    "ref_step": pl.Int64,
    "ref_tokens_seen": pl.Int64,
    "layer": pl.Int64,
    "ref_layer": pl.Int64,
    "site": pl.String,
    "measure": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
    "n_tokens": pl.Int64,
    "reason": pl.String,
}
TOKEN_KEY = ("seq", "position", "token_id")
#: The extract settings (extract.json) that choose the sampled tokens, beside the corpus and the tokenizer.
SAMPLE_SETTINGS = ("n_sequences", "seq_len", "sample_tokens", "seed")


class ComparisonError(ValueError):
    """Two checkpoints that cannot be compared (not the same sample of tokens), or a comparative measure that
    fails: the message names both checkpoints."""


@dataclass(frozen=True)
class Settings:
    """The config's `compare` settings that change the built-in measures' values."""

    measures: tuple[str, ...] = BUILTIN_COMPARATIVE
    cka_debiased: bool = False
    svcca_variance: float = 0.99
    sites: tuple[str, ...] = ("resid",)
    #: SVCCA and PWCCA only where neither side is wider (None: at every width); CKA at every width.
    cca_max_width: int | None = 1024

    @classmethod
    def of(cls, section: Mapping) -> Settings:
        keys = ("measures", "cka_debiased", "svcca_variance", "sites", "cca_max_width")
        known = {k: section[k] for k in keys if k in section}
        for key in ("measures", "sites"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)

    def cca_measures(self, width: int) -> tuple[str, ...]:
        """The CCA measures (svcca, pwcca) asked for and computed at a layer `width` dimensions wide."""
        if self.cca_max_width is not None and width > self.cca_max_width:
            return ()
        return tuple(name for name in ("svcca", "pwcca") if name in self.measures)

    def left_out(self, width: int) -> tuple[str, ...]:
        """The CCA measures asked for but not computed at `width` (wider than cca_max_width)."""
        computed = self.cca_measures(width)
        return tuple(name for name in ("svcca", "pwcca") if name in self.measures and name not in computed)


@dataclass
class Checkpoint:
    """One checkpoint's identity and its sampled hidden states per (layer, site): the token keys, the vectors and a
    bound on the Frobenius norm of their rounding (`rounding_bound`)."""

    identity: dict
    settings: dict = field(default_factory=dict)
    keys: dict[tuple[int, str], pl.DataFrame] = field(default_factory=dict)
    vectors: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    rounding: dict[tuple[int, str], float] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: str | Path, sites: Iterable[str]) -> Checkpoint:
        folder = Path(folder)
        info = json.loads((folder / "extract.json").read_text())
        path = folder / "hidden.parquet"
        hidden = read_parquet(path)
        storage = precision_of(pl.read_parquet_schema(path), "vector")
        if storage == "int8":  # decoding drops the per-vector scales, which bound the quantisation
            hidden = hidden.with_columns(read_parquet(path, columns=["vector_scale"])["vector_scale"])
        hidden = hidden.filter(pl.col("site").is_in(list(sites)))
        out = cls({key: info["checkpoint"].get(key) for key in IDENTITY}, info.get("settings") or {})
        for (layer, site), group in sorted(hidden.group_by("layer", "site"), key=lambda g: g[0]):
            group = group.sort("seq", "position")
            out.keys[(layer, site)] = group.select(TOKEN_KEY)
            x = out.vectors[(layer, site)] = _matrix(group["vector"])
            scales = group["vector_scale"].to_numpy().astype(np.float64) if storage == "int8" else None
            out.rounding[(layer, site)] = rounding_bound(x, out.settings.get("dtype"), storage, scales)
        return out

    @property
    def name(self) -> str:
        return f"{self.identity['family']}/{self.identity['model']}/step{self.identity['step']}"


def _matrix(vectors: pl.Series) -> np.ndarray:
    """A column of equal-length float lists as an (n, d) float64 array, without a Python object per value."""
    d = int(vectors.list.len().max() or 0)
    return vectors.explode().to_numpy().astype(np.float64).reshape(len(vectors), d)


def check_same_sample(a: Checkpoint, b: Checkpoint) -> list[tuple[int, str]]:
    """The (layer, site)s both checkpoints hold, after checking that each holds the same tokens in both."""
    shared = sorted(set(a.keys) & set(b.keys))
    if not shared:
        raise ComparisonError(
            f"{a.name} and {b.name} share no (layer, site) of hidden.parquet: {sorted(a.keys)} against {sorted(b.keys)}"
        )
    for where in shared:
        ka, kb = a.keys[where], b.keys[where]
        if ka.height != kb.height or not ka.equals(kb):
            same_positions = ka.height == kb.height and ka["seq", "position"].equals(kb["seq", "position"])
            differ = "token_id" if same_positions else "(seq, position)"
            raise ComparisonError(
                f"{a.name} and {b.name} do not hold the same sampled tokens at layer {where[0]} {where[1]} "
                f"({ka.height} against {kb.height} tokens; their {differ} differ): {_why_other_tokens(a, b)}. "
                "Comparative measures need one evaluation sample for both (the same corpus, tokenizer and extract "
                f"settings {', '.join(SAMPLE_SETTINGS)}): extract both with one config"
            )
    return shared


def _why_other_tokens(a: Checkpoint, b: Checkpoint) -> str:
    """The extract settings that differ between the two checkpoints' extract.json, or, where none does, what is left:
    the text or its tokenizer."""
    differ = [
        f"{key} {a.settings.get(key)} against {b.settings.get(key)}"
        for key in SAMPLE_SETTINGS
        if a.settings.get(key) != b.settings.get(key)
    ]
    if differ:
        return f"extract.json settings differ, {'; '.join(differ)}"
    return (
        f"their extract.json settings {', '.join(SAMPLE_SETTINGS)} agree, so the evaluation text or its tokens differ: "
        f"another corpus, or another tokenizer ({a.identity['model']}'s against {b.identity['model']}'s)"
    )


# --------------------------------------------------------------------------- CCA (google/svcca's, from covariances)


#: The machine epsilon of each dtype extract may run in (extract.dtype): the resolution of the stored samples.
RESOLUTION = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
#: How far above 1 a canonical correlation may lie before the CCA is taken as ill-conditioned.
CORRELATION_SLACK = 1e-6
#: The gap between float16's subnormals: below its normal range float16 storage rounds a value by up to half of it,
#: more than 2^-11 of the value.
FLOAT16_SUBNORMAL = 2.0**-24


def rounding_bound(
    x: np.ndarray, dtype: str | None = None, storage: str = "float32", scales: np.ndarray | None = None
) -> float:
    """A bound on ||E||_F, E the rounding in the sample x (n x d) as read back: extract's `dtype` (RESOLUTION; float32
    where None) rounds each value by at most resolution / 2 of it; storing it as float16 (extract.sample_precision)
    rounds it again by 2^-11 of it (half a subnormal gap below float16's normal range); int8 storage moves each of a
    vector's d - k quantised components (k = sample_storage.outliers(d) kept exactly; files written when k was 4 have
    fewer, so the bound holds for them too) by at most half that vector's stored scale s_i (`scales`), so by
    sqrt(sum_i (d - k) s_i^2 / 4) in all."""
    size = np.sqrt(np.square(x).sum())
    bound = RESOLUTION.get(dtype, RESOLUTION["float32"]) / 2 * size
    if storage == "float16" and dtype != "float16":
        bound += RESOLUTION["float16"] / 2 * size + FLOAT16_SUBNORMAL / 2 * np.sqrt(x.size)
    elif storage == "int8":
        if scales is None:
            raise ValueError("int8 storage's rounding needs each vector's stored scale (hidden.parquet's vector_scale)")
        quantised = x.shape[1] - outliers(x.shape[1])
        bound += np.sqrt(quantised * np.nansum(np.square(scales)) / 4)
    elif storage not in ("float32", "float16"):
        raise ValueError(f"sample storage {storage!r} is not one of float32, float16, int8")
    return float(bound)


class IllConditioned(ArithmeticError):
    """A CCA that rounding decides: its row is NaN with this reason."""


@dataclass(frozen=True)
class CrossProducts:
    """What every built-in measure of a pair needs, computed once: n, x's column means and the centred products
    Xc^T Xc, Xc^T Yc, Yc^T Yc (d x d; never n x n), the centred rows' squared norms (the unbiased HSIC's), a bound on
    each sample's rounding (`rounding_bound`: its floor's scale), and on first use each side's principal directions
    above its floor, which SVCCA and PWCCA share. Always float64, whatever the samples' dtype."""

    n: int
    mean_x: np.ndarray
    xx: np.ndarray
    xy: np.ndarray
    yy: np.ndarray
    row_norms_x: np.ndarray
    row_norms_y: np.ndarray
    rounding_x: float
    rounding_y: float

    @classmethod
    def of(
        cls, x: np.ndarray, y: np.ndarray, rounding_x: float | None = None, rounding_y: float | None = None
    ) -> CrossProducts:
        """`rounding_x`, `rounding_y`: the samples' rounding bounds; None: float32 rounding of the values given."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        mean_x = x.mean(axis=0)
        xc, yc = x - mean_x, y - y.mean(axis=0)
        norms_x, norms_y = np.einsum("ij,ij->i", xc, xc), np.einsum("ij,ij->i", yc, yc)  # no n x d temporary
        rounding_x = rounding_bound(x) if rounding_x is None else rounding_x
        rounding_y = rounding_bound(y) if rounding_y is None else rounding_y
        return cls(x.shape[0], mean_x, xc.T @ xc, xc.T @ yc, yc.T @ yc, norms_x, norms_y, rounding_x, rounding_y)

    @staticmethod
    def floor(rounding: float) -> float:
        """The eigenvalue of Xc^T Xc at or below which a principal direction may be rounding alone: a rounding E of
        the sample moves its singular values by at most ||E||_2 <= ||E||_F <= `rounding` (Weyl); the floor is twice
        that, squared, as an eigenvalue."""
        return (2 * rounding) ** 2

    @cached_property
    def principal_x(self) -> tuple[np.ndarray, np.ndarray]:
        return _principal(np.linalg.eigh(self.xx), self.floor(self.rounding_x))

    @cached_property
    def principal_y(self) -> tuple[np.ndarray, np.ndarray]:
        return _principal(np.linalg.eigh(self.yy), self.floor(self.rounding_y))


def _principal(eig: tuple[np.ndarray, np.ndarray], floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The principal variances above `floor` and their directions, largest first."""
    w, v = eig[0][::-1], eig[1][:, ::-1]
    keep = w > floor
    return w[keep], v[:, keep]


def _whitened(products: CrossProducts, x: tuple[np.ndarray, np.ndarray], y: tuple[np.ndarray, np.ndarray]):
    """Sxy on the two sides' principal directions (variances w, directions v), each scaled to unit variance:
    diag(wx^-1/2) Vx^T Sxy Vy diag(wy^-1/2), whose singular values are the canonical correlations; an IllConditioned
    where float64 cannot resolve them (a side's variances span more than CORRELATION_SLACK / eps64)."""
    for (w, _), side in ((x, "the checkpoint"), (y, "the reference")):
        if np.finfo(np.float64).eps * w[0] / w[-1] > CORRELATION_SLACK:
            raise IllConditioned(
                f"{side}'s principal variances above rounding span a ratio of {w[0] / w[-1]:.2g}: whitening resolves "
                f"its canonical correlations no better than {np.finfo(np.float64).eps * w[0] / w[-1]:.1g}, so the "
                "CCA is ill-conditioned"
            )
    return (x[1].T @ products.xy @ y[1]) / np.sqrt(x[0])[:, None] / np.sqrt(y[0])[None, :]


def _correlations(whitened: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The canonical directions (left singular vectors, on the first side's principal directions) and correlations
    of a whitened cross-covariance; an IllConditioned where a correlation exceeds 1 by more than rounding."""
    u, rho, _ = np.linalg.svd(whitened)
    _check_correlations(rho)
    return u, rho


def _canonical_correlations(whitened: np.ndarray) -> np.ndarray:
    """The canonical correlations alone: the singular values without their vectors, a third of the SVD's work."""
    rho = np.linalg.svd(whitened, compute_uv=False)
    _check_correlations(rho)
    return rho


def _check_correlations(rho: np.ndarray) -> None:
    if len(rho) and rho.max() > 1 + CORRELATION_SLACK:
        raise IllConditioned(
            f"canonical correlations up to 1 + {rho.max() - 1:.2g} exceed 1: the CCA of this sample is ill-conditioned"
        )


def svcca(x: np.ndarray, y: np.ndarray, variance: float = 0.99) -> float:
    """The mean canonical correlation of x and y (n x d) each reduced to its top principal directions explaining
    `variance` of its variance (Raghu et al. 2017), among those above its rounding floor."""
    return svcca_of(CrossProducts.of(x, y), variance)


def svcca_of(products: CrossProducts, variance: float) -> float:
    """The reduced samples' covariances are diagonal (their principal variances), so the CCA of the reductions is
    the singular values of diag(wx^-1/2) Vx^T Sxy Vy diag(wy^-1/2)."""
    whitened = _whitened(products, _top(products.principal_x, variance), _top(products.principal_y, variance))
    return float(_canonical_correlations(whitened).mean())


def _top(principal: tuple[np.ndarray, np.ndarray], variance: float) -> tuple[np.ndarray, np.ndarray]:
    """The principal variances and directions (largest first) that first sum to `variance` of the total."""
    w, v = principal
    k = min(int(np.searchsorted(np.cumsum(w) / w.sum(), variance - 1e-12) + 1), len(w))
    return w[:k], v[:, :k]


def pwcca(x: np.ndarray, y: np.ndarray) -> float:
    """Projection-weighted CCA (Morcos et al. 2018) as pwcca.compute_pwcca(x.T, y.T) computes it: each canonical
    correlation weighted by the summed |projection| of x's neurons on the canonical variates. A side of less than
    full rank (above its rounding floor) enters as its centred principal coordinates above the floor."""
    return pwcca_of(CrossProducts.of(x, y))


def pwcca_of(products: CrossProducts) -> float:
    """PWCCA from the d x d products. The canonical directions u are the left singular vectors of
    Sxx^-1/2 Sxy Syy^-1/2 (cca_core.compute_ccas). The reference's directions D = u^T Xc^T + m 1^T (d x n) are
    orthonormalised by QR, D^T = P R, and weighted by sum_j |(P^T X)_ij|; here R comes from the Cholesky factor of
    D D^T = u^T C u + n m m^T (C = Xc^T Xc; Xc's columns sum to 0) and P^T X = R^-T D X = R^-T (u^T C + n m m^T):
    the same numbers up to each row's sign, which |.| drops, without the n x d product. On x's principal coordinates
    Z = Xc V (a side of less than full rank), C = diag(w) and m = 0."""
    (wx, vx), (_, vy) = products.principal_x, products.principal_y
    whitened = _whitened(products, products.principal_x, products.principal_y)
    if len(wx) < len(products.xx):
        (u, rho), c, m = _correlations(whitened), np.diag(wx), np.zeros(len(wx))
    else:  # on the neurons, where the reference's SVD sets the sign of each u, which its m 1^T term keeps
        (u, rho), c, m = _correlations(vx @ whitened @ vy.T), products.xx, products.mean_x
    drift = products.n * np.outer(m, m)
    uc = u.T @ c
    lower = np.linalg.cholesky(uc @ u + drift)
    weights = np.abs(solve_triangular(lower, uc + drift, lower=True, check_finite=False)).sum(axis=1)
    weights = weights[: len(rho)] / weights.sum()
    return float(np.sum(weights * np.abs(rho)))


# --------------------------------------------------------------------------- the built-in measures of one pair


def nonfinite(x: np.ndarray, name: str) -> str | None:
    """Why a sample cannot be measured, where it holds NaN or infinite values: the counts and whose they are."""
    bad = ~np.isfinite(x)
    if not bad.any():
        return None
    nan, inf = int(np.isnan(x).sum()), int(bad.sum() - np.isnan(x).sum())
    return (
        f"{name}'s sample holds non-finite values ({nan} NaN, {inf} infinite of its {x.shape[0]} x {x.shape[1]}, in "
        f"{int(bad.any(axis=1).sum())} tokens; extract.json's nonfinite_tokens counts them), so every measure of it "
        "is NaN"
    )


def builtin_rows(
    x: np.ndarray,
    y: np.ndarray,
    settings: Settings,
    rounding: tuple[float | None, float | None] = (None, None),
    names: tuple[str, str] = ("the checkpoint", "the reference"),
) -> list[dict]:
    """The built-in measures' rows of one (layer, site) of a pair, from one set of cross-products; a value that
    cannot be computed is NaN with its reason. `rounding`: bounds on the two samples' rounding (`rounding_bound`;
    None: float32's of the values); `names`: the two checkpoints', for the reasons. SVCCA and PWCCA only up to
    settings.cca_max_width."""
    n, d = x.shape[0], max(x.shape[1], y.shape[1])
    cca_measures = settings.cca_measures(d)
    metrics = [("cka", "cka")] * ("cka" in settings.measures)
    metrics += [("cka", "cka_debiased")] * ("cka" in settings.measures and settings.cka_debiased)
    metrics += [(name, name) for name in cca_measures]
    broken = [reason for reason in (nonfinite(x, names[0]), nonfinite(y, names[1])) if reason]
    if broken:
        return [_row(measure, metric, None, "; ".join(broken)) for measure, metric in metrics]
    rows = []
    products = CrossProducts.of(x, y, *rounding)
    if "cka" in settings.measures:
        rows.append(_row("cka", "cka", cka_of(products, False)))
        if settings.cka_debiased:
            value = cka_of(products, True) if n >= 4 else None
            rows.append(_row("cka", "cka_debiased", value, None if value is not None else "fewer than 4 tokens"))
    for name in cca_measures:
        value, reason = cca_value(name, products, settings)
        rows.append(_row(name, name, value, reason))
    return rows


def cca_value(name: str, products: CrossProducts, settings: Settings) -> tuple[float | None, str | None]:
    """SVCCA or PWCCA (`name`) of one pair's cross-products, or None and why it cannot be computed."""
    n, d = products.n, max(len(products.xx), len(products.yy))
    if n <= d:
        return None, f"CCA needs more sampled tokens ({n}) than dimensions ({d})"
    if not len(products.principal_x[0]) or not len(products.principal_y[0]):
        return None, "a representation without spread above the rounding of its values"
    try:
        return (svcca_of(products, settings.svcca_variance) if name == "svcca" else pwcca_of(products)), None
    except IllConditioned as error:
        return None, str(error)
    except np.linalg.LinAlgError as error:
        return None, f"linear algebra failed: {error}"


def cka_of(products: CrossProducts, debiased: bool) -> float:
    """Linear CKA from the centred cross-products (anisweep.measures.cka's HSIC)."""
    fx = Features(np.empty((products.n, 0)), products.row_norms_x, float(np.square(products.xx).sum()))
    fy = Features(np.empty((products.n, 0)), products.row_norms_y, float(np.square(products.yy).sum()))
    xy = hsic(fx, fy, debiased, cross=float(np.square(products.xy).sum()))
    xx = hsic(fx, fx, debiased, cross=fx.self_product)
    yy = hsic(fy, fy, debiased, cross=fy.self_product)
    return xy / np.sqrt(xx * yy) if xx > 0 and yy > 0 else float("nan")


def _row(measure: str, metric: str, value, reason: str | None = None) -> dict:
    return {"measure": measure, "metric": metric, "value": np.nan if value is None else float(value), "reason": reason}


# --------------------------------------------------------------------------- a pair's table


def compare_pair(
    folder: str | Path,
    ref_folder: str | Path,
    settings: Settings = Settings(),
    user: Iterable = (),
) -> pl.DataFrame:
    """Every comparative measure of the checkpoint in `folder` against the one in `ref_folder`, per shared
    (layer, site); `user`: the user's comparative measures (anisweep.measures.registry.Measure)."""
    a, b = Checkpoint.read(folder, settings.sites), Checkpoint.read(ref_folder, settings.sites)
    rows, left_out = [], {}
    for layer, site in check_same_sample(a, b):
        x, y = a.vectors[(layer, site)], b.vectors[(layer, site)]
        width = max(x.shape[1], y.shape[1])
        left_out.update(dict.fromkeys(settings.left_out(width), width))
        rounding = (a.rounding[(layer, site)], b.rounding[(layer, site)])
        found = builtin_rows(x, y, settings, rounding, (a.name, b.name))
        found += [r for m in user for r in user_rows(m, x, y, a, b, layer, site)]
        rows += [{"layer": layer, "ref_layer": layer, "site": site, "n_tokens": x.shape[0], **r} for r in found]
    if left_out:
        print(
            f"{a.name} against {b.name}: {' and '.join(left_out)} not computed at width {max(left_out.values())}, "
            f"above compare.cca_max_width {settings.cca_max_width} (their cost grows with the width cubed; "
            "docs/performance.md): raise it, or set it to null, to compute them",
            file=sys.stderr,
        )
    return pair_frame(a.identity, b.identity, rows)


def user_rows(measure, x, y, a: Checkpoint, b: Checkpoint, layer: int, site: str) -> list[dict]:
    """A user's comparative measure's rows of one (layer, site): it returns a number or rows of metric and value."""
    where = f"comparative measure {measure.name!r} ({measure.entry}) at {a.name} against {b.name}, layer {layer} {site}"
    try:
        found = measure.target(x, y)
    except Exception as error:
        raise ComparisonError(f"{where} failed: {type(error).__name__}: {error}") from error
    if isinstance(found, (int, float, np.floating, np.integer)) and not isinstance(found, bool):
        found = [{"metric": measure.name, "value": float(found)}]
    if isinstance(found, pl.DataFrame):
        found = found.to_dicts()
    if isinstance(found, Mapping) or not isinstance(found, Iterable):
        raise ComparisonError(f"{where} returned {type(found).__name__}; expected a number or rows of metric and value")
    rows = []
    for r in found:
        if not isinstance(r, Mapping) or not isinstance(r.get("metric"), str) or "value" not in r:
            raise ComparisonError(f"{where}: every row needs a 'metric' (a string) and a 'value': got {r!r}")
        unknown = set(r) - {"metric", "value", "reason"}
        if unknown:
            raise ComparisonError(f"{where}: rows hold {sorted(unknown)}; a row holds metric, value and reason")
        value = r["value"]
        rows.append(_row(measure.name, r["metric"], None if value is None else float(value), r.get("reason")))
    return rows


def layer_matrix(folder: str | Path, settings: Settings = Settings()) -> pl.DataFrame:
    """Linear CKA of every pair of layers of one checkpoint, per site (the checkpoint against itself); a pair with a
    layer whose sample holds non-finite values is NaN with the reason."""
    a = Checkpoint.read(folder, settings.sites)
    rows = []
    for site in sorted({s for _, s in a.vectors}):
        layers = sorted(layer for layer, s in a.vectors if s == site)
        broken = {layer: nonfinite(a.vectors[(layer, site)], f"{a.name} layer {layer} {site}") for layer in layers}
        finite = [layer for layer in layers if broken[layer] is None]
        matrix = cka_matrix([a.vectors[(layer, site)] for layer in finite], debiased=False)
        n = a.vectors[(layers[0], site)].shape[0]
        for li in layers:
            for lj in layers:
                reason = "; ".join(dict.fromkeys(r for r in (broken[li], broken[lj]) if r)) or None
                value = None if reason else matrix[finite.index(li), finite.index(lj)]
                rows.append(
                    {"layer": li, "ref_layer": lj, "site": site, "n_tokens": n, **_row("cka", "cka", value, reason)}
                )
    return pair_frame(a.identity, a.identity, rows)


def pair_frame(identity: dict, ref: dict, rows: list[dict]) -> pl.DataFrame:
    ident = {key: identity.get(key) for key in IDENTITY}
    ref_ident = {f"ref_{key}": ref.get(key) for key in ("model", "seed", "step", "tokens_seen")}
    return pl.DataFrame([{**ident, **ref_ident, **r} for r in rows], schema=PAIR_SCHEMA, orient="row")


# --------------------------------------------------------------------------- a model's comparisons


def aggregate(pairs: Iterable[tuple[str, str | Path]]) -> pl.DataFrame:
    """Every pair table of a model in one: `pairs` (role, path), the role (`final`, `previous`, `step`, `seed`,
    `layers`) a column of its rows; a path in several roles gives its rows once per role."""
    frames = [read_parquet(path).with_columns(role=pl.lit(role)) for role, path in pairs]
    if not frames:
        return pl.DataFrame(schema={**PAIR_SCHEMA, "role": pl.String})
    return pl.concat(frames, how="vertical").sort("role", "ref_model", "step", "site", "layer", "ref_layer", "measure")
