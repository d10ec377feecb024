"""The Multi-Bootstrap (anisweep.measures.bootstrap) of the measures of the sampled vectors, from hidden.parquet
(the estimates from metrics.parquet): a model's example-level intervals, a group of seeds' intervals over seeds and
sequences, and the paired tests of each step against the previous and the final step (docs/measures.md, Uncertainty
over seeds and sequences).

The units are extract's resampling units (extract.json's `n_sequences` and `units`: each sequence, or consecutive
groups of them, as units.parquet's sums): a replicate draws that many with replacement and keeps every sampled token of
each drawn unit, as often as it is drawn. A measure of the sampled vectors is a function of their spectrum, so each
unit's Gram matrix, sum and count of its sampled (finite) vectors give any replicate's spectrum from its counts,
without the vectors; IsoScore, a function of the covariance's trace and Frobenius norm, needs only products computed
once per site (unit_products), no d x d matrix per replicate. The estimate is the value the checkpoint's metrics job
wrote to metrics.parquet; the replicates use the same formulas on the replicate's moments, equal to metrics' functions
on the drawn vectors up to rounding (tests/measures/test_sample_bootstrap.py). The measures of a site share each
replicate's moments.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures import bootstrap, compare, geometry, pair_bootstrap, spectral, sum_bootstrap
from anisweep.measures.grouped import group_rows, vectors_by_group
from anisweep.measures.pair_bootstrap import Pair, PairSide
from anisweep.measures.unit_products import UnitProducts
from anisweep.sample_storage import precision_of
from anisweep.tables import METRIC_PARAMETERS, read_parquet

#: the measures this module resamples, each a metric of metrics.parquet, and the default (the config's, a few
#: percent of extract's time: the spectral measures cost an eigendecomposition per replicate, on request)
MEASURES = ("isoscore", "top_eig_share", "rankme", "rankme_cov", "alpha_req", "prop_effective_rank")
DEFAULT_MEASURES = ("isoscore", "avg_cos", "entropy_mean", "qk_cos")
#: at most this many float64s of per-sequence Gram matrices are held per site (256 MiB): past it, each replicate's
#: Gram matrix is summed from the weighted vectors instead (slower, no more memory than the vectors)
MAX_UNIT_GRAM_ELEMENTS = 1 << 25
#: replicates' d x d matrices held at once
CHUNK_ELEMENTS = 1 << 22

SCHEMA = {
    "group": pl.String,
    "models": pl.List(pl.String),
    "family": pl.String,
    "model": pl.String,
    "seed": pl.Int64,
    "step": pl.Int64,
    "tokens_seen": pl.Int64,
    "layer": pl.Int64,
    "site": pl.String,
    "head": pl.Int64,
    "metric": pl.String,
    "against": pl.String,
    "ref_step": pl.Int64,
    "estimate": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "bias": pl.Float64,
    "p": pl.Float64,
    "level": pl.Float64,
    "n_seeds": pl.Int64,
    "n_units": pl.Int64,
    "samples": pl.Int64,
    "undefined": pl.Int64,
    "design": pl.String,
}


class BootstrapInputError(ValueError):
    """The checkpoints of a model or group cannot be resampled together."""


# --------------------------------------------------------------------------------------- one site's moments


@dataclass(frozen=True)
class Moments:
    """A batch of replicates' second moments of one site's sampled vectors: gram (b, d, d) = sum x x^T, total (b, d)
    = sum x, count (b,) = the number of vectors, each vector as often as its sequence is drawn."""

    gram: np.ndarray
    total: np.ndarray
    count: np.ndarray

    @property
    def scatter(self) -> np.ndarray:
        """sum (x - mean)(x - mean)^T; zero where no vector is drawn."""
        n = np.maximum(self.count, 1.0)[:, None, None]
        return self.gram - self.total[:, :, None] * self.total[:, None, :] / n

    @functools.cached_property
    def gram_eigenvalues(self) -> np.ndarray:
        """(b, d) the Gram matrix's eigenvalues, descending, clipped at 0: the squared uncentred singular values."""
        return np.clip(np.linalg.eigvalsh(self.gram)[:, ::-1], 0.0, None)

    @functools.cached_property
    def covariance_eigenvalues(self) -> np.ndarray:
        """(b, d) eigenvalues of the covariance (ddof 1), descending, clipped at 0, as geometry.cov_eigvals."""
        n = np.maximum(self.count - 1.0, 1.0)[:, None, None]
        return np.clip(np.linalg.eigvalsh(self.scatter / n)[:, ::-1], 0.0, None)

    @property
    def spread(self) -> np.ndarray:
        """geometry.relative_spread: the scatter's trace over the Gram matrix's (NaN where the latter is 0)."""
        whole = np.trace(self.gram, axis1=1, axis2=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(whole > 0, np.trace(self.scatter, axis1=1, axis2=2) / whole, np.nan)


def _spectrum_rank(lam: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The eigenvalues as an SVD of the n drawn vectors gives them: min(n, d) of them (spectral's functions count
    them), those at eigvalsh's rounding of the largest (d x eps of it: an SVD's exact zeros of a rank-deficient
    draw) set to 0. (b, d) with NaN past each row's min(n, d)."""
    d = lam.shape[1]
    out = np.where(lam > lam[:, :1] * d * np.finfo(np.float64).eps, lam, 0.0)
    return np.where(np.arange(d)[None, :] < np.minimum(n, d)[:, None], out, np.nan)


def _per_replicate(fn: Callable[[np.ndarray], float], spectra: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """fn of each row's spectrum (its NaN tail dropped), NaN where not `usable`."""
    return np.array([fn(s[np.isfinite(s)]) if ok else np.nan for s, ok in zip(spectra, usable)], dtype=np.float64)


def rankme_cov(m: Moments) -> np.ndarray:
    """spectral.rankme of the covariance's eigenvalues (spectral.sample_spectral_values' `rankme_cov`)."""
    lam = _spectrum_rank(m.covariance_eigenvalues, m.count)
    return _per_replicate(spectral.rankme, lam, m.count >= 2)


def alpha_req(m: Moments) -> np.ndarray:
    """spectral.alpha_req of the covariance's eigenvalues: the power-law exponent over ranks 12 to 100 (fewer where
    fewer are positive)."""
    lam = _spectrum_rank(m.covariance_eigenvalues, m.count)
    return _per_replicate(lambda s: spectral.alpha_req(s)[0], lam, m.count >= 2)


def prop_effective_rank(m: Moments) -> np.ndarray:
    """spectral.proportional_effective_rank of the uncentred singular values."""
    squared = _spectrum_rank(m.gram_eigenvalues, m.count)
    return _per_replicate(spectral.proportional_effective_rank, np.sqrt(squared), m.count >= 1)


def _has_spread(m: Moments) -> np.ndarray:
    """Where sample_rows computes its spectral measures: at least 2 vectors with spread (metrics.sample_rows)."""
    spread = m.spread
    return (m.count >= 2) & (np.nan_to_num(spread, nan=-1.0) >= geometry.SPREAD_TOLERANCE)


def top_eig_share(m: Moments) -> np.ndarray:
    """geometry.top_eig_share from the covariance's eigenvalues; NaN where metrics.sample_rows gives NaN."""
    lam = m.covariance_eigenvalues
    trace = lam.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(_has_spread(m) & (trace > 0), lam[:, 0] / np.where(trace > 0, trace, 1.0), np.nan)


def rankme(m: Moments) -> np.ndarray:
    """spectral.rankme of the uncentred singular values (the square roots of the Gram matrix's eigenvalues, the
    min(n, d) largest, as the SVD of n vectors gives them)."""
    squared = _spectrum_rank(m.gram_eigenvalues, m.count)
    return _per_replicate(spectral.rankme, np.sqrt(squared), m.count >= 1)


#: the measures computed from each replicate's moments; IsoScore's replicates need no d x d matrix (unit_products)
OF_MOMENTS: dict[str, Callable[[Moments], np.ndarray]] = {
    "top_eig_share": top_eig_share,
    "rankme": rankme,
    "rankme_cov": rankme_cov,
    "alpha_req": alpha_req,
    "prop_effective_rank": prop_effective_rank,
}


@dataclass(frozen=True)
class SiteSample:
    """One checkpoint's sampled vectors at one (layer, site): the finite vectors (table order; None where no measure
    of the replicates' moments is resampled), each one's resampling unit, and IsoScore's per-unit products where
    IsoScore or CKA is resampled (UnitProducts), and the comparisons' view of every sampled row where they are
    resampled (pair_bootstrap.PairSide). The per-unit Gram matrices are kept where they fit MAX_UNIT_GRAM_ELEMENTS."""

    x: np.ndarray | None
    unit: np.ndarray
    n_units: int
    products: UnitProducts | None = None
    pair: PairSide | None = None

    @classmethod
    def of(cls, x: np.ndarray, unit: np.ndarray, n_units: int, measures: Sequence[str]) -> SiteSample:
        """What `measures` need of the vectors x (rows, d) and their units."""
        products = UnitProducts.of(x, unit, n_units) if {"isoscore", "cka"} & set(measures) else None
        kept = x.astype(np.float64) if any(m in OF_MOMENTS for m in measures) else None
        return cls(kept, unit, n_units, products)

    def moments(self, counts: np.ndarray) -> Moments:
        """The replicates' moments for (b, n_units) counts of each unit."""
        weights = counts[:, self.unit]  # (b, rows)
        count = weights.sum(axis=1)
        total = weights @ self.x
        grams = self._unit_grams
        if grams is not None:
            gram = np.tensordot(counts, grams, axes=([1], [0]))
        else:
            gram = np.stack([(self.x * w[:, None]).T @ self.x for w in weights])
        return Moments(gram, total, count)

    @property
    def _unit_grams(self) -> np.ndarray | None:
        d = self.x.shape[1]
        if self.n_units * d * d > MAX_UNIT_GRAM_ELEMENTS:
            return None
        cached = self.__dict__.get("_grams")
        if cached is None:
            cached = np.zeros((self.n_units, d, d))
            for u in np.unique(self.unit):
                xu = self.x[self.unit == u]
                cached[u] = xu.T @ xu
            object.__setattr__(self, "_grams", cached)
        return cached

    def values(self, metric: str, units: np.ndarray) -> np.ndarray:
        """`metric` on each row of `units` (draws x n_units unit indices)."""
        return self.shared_values(metric, (), units)

    def shared_values(self, metric: str, metrics: Sequence[str], units: np.ndarray) -> np.ndarray:
        """`metric` on each row of `units`; the measures of the replicates' moments among `metrics` are computed
        from the same moments and kept until they are asked for on the same draws: a site builds each replicate's
        Gram matrix once."""
        if metric == "isoscore":
            return self._isoscores(units)
        pending = self.__dict__.setdefault("_pending", {})
        key = (units.shape, hashlib.blake2b(np.ascontiguousarray(units).tobytes(), digest_size=16).digest())
        if metric not in pending.get(key, {}):
            wanted = [m for m in dict.fromkeys((metric, *metrics)) if m in OF_MOMENTS]
            pending[key] = self._of_moments({m: OF_MOMENTS[m] for m in wanted}, units)
        got = pending[key].pop(metric)
        if not pending[key]:
            del pending[key]
        return got

    def _isoscores(self, units: np.ndarray) -> np.ndarray:
        chunk = max(1, CHUNK_ELEMENTS // max(1, self.n_units * self.n_units))
        got = [
            self.products.isoscore(bootstrap.unit_counts(units[start : start + chunk], self.n_units))
            for start in range(0, len(units), chunk)
        ]
        return np.concatenate(got) if got else np.zeros(0)

    def _of_moments(self, measures: dict[str, Callable[[Moments], np.ndarray]], units: np.ndarray) -> dict:
        d = self.x.shape[1]
        chunk = max(1, CHUNK_ELEMENTS // max(1, d * d))
        out = {name: [] for name in measures}
        for start in range(0, len(units), chunk):
            m = self.moments(bootstrap.unit_counts(units[start : start + chunk], self.n_units))
            for name, measure in measures.items():
                out[name].append(measure(m))
        return {name: np.concatenate(got) if got else np.zeros(0) for name, got in out.items()}


# --------------------------------------------------------------------------------------- a checkpoint


@dataclass(frozen=True)
class Checkpoint:
    """What the bootstrap reads of one checkpoint's folder: its identity, its sequences, each (layer, site)'s
    sample, the sampled tokens' (seq, position, token_id) that name the evaluation sample, and metrics' values."""

    family: str
    model: str
    seed: int | None
    step: int
    tokens_seen: int | None
    n_units: int
    sites: dict[tuple[int, str], SiteSample]
    tokens: dict[tuple[int, str], np.ndarray]
    exact: dict[tuple[str, int, str], float]

    @property
    def name(self) -> str:
        return f"{self.family}/{self.model}"


def read_checkpoint(folder: str | Path, measures: Sequence[str]) -> Checkpoint:
    """A checkpoint's hidden.parquet and extract.json; `exact`: the values of `measures` (those of metrics.parquet)
    at each sampled site that its metrics job wrote there. Where `measures` holds comparisons (pair_bootstrap), each
    site keeps its every sampled row for them, with the rounding bound of extract's dtype and the sample's storage."""
    folder = Path(folder)
    info = json.loads((folder / "extract.json").read_text())
    size = unit_size(info["settings"])
    n_units = -(-int(info["settings"]["n_sequences"]) // size)
    if not measures:  # the measures built of sums alone: the checkpoint's identity, no vectors
        first = pl.scan_parquet(folder / "hidden.parquet").select(*IDENTITY_COLUMNS).head(1).collect()
        if first.is_empty():
            raise BootstrapInputError(f"{folder / 'hidden.parquet'}: no rows; rerun its extract")
        return Checkpoint(*first.row(0), n_units, {}, {}, {})
    path = folder / "hidden.parquet"
    hidden = read_parquet(path)
    compared = [m for m in measures if m in pair_bootstrap.MEASURES]
    storage = precision_of(pl.read_parquet_schema(path), "vector") if compared else "float32"
    scales = read_parquet(path, columns=["vector_scale"])["vector_scale"] if storage == "int8" else None
    if hidden.is_empty():
        raise BootstrapInputError(f"{folder / 'hidden.parquet'}: no sampled tokens; nothing to resample")
    n_sequences = int(info["settings"]["n_sequences"])
    if int(hidden["seq"].max()) >= n_sequences or int(hidden["seq"].min()) < 0:
        raise BootstrapInputError(
            f"{folder / 'hidden.parquet'}: sequence indices outside 0..{n_sequences - 1} of extract.json's "
            "n_sequences; the two files are of different runs: rerun its extract"
        )
    sites, tokens = {}, {}
    for (layer, site), group in _groups(hidden, scales):
        x, unit = group["x"], group["seq"] // size
        finite = np.isfinite(x).all(axis=1)
        sample = SiteSample.of(x[finite], unit[finite], n_units, measures)
        if compared:
            side = PairSide.of(
                x, unit, n_units, dtype=info["settings"].get("dtype"), storage=storage, scales=group.get("scale"),
                products=sample.products if finite.all() else None, cka="cka" in compared,
            )  # fmt: skip
            sample = dataclasses.replace(sample, pair=side)
        sites[(layer, site)] = sample
        tokens[(layer, site)] = group["tokens"]
    exact = metric_values(folder / "metrics.parquet", [m for m in measures if m in MEASURES], sorted(sites))
    first = hidden.row(0, named=True)
    return Checkpoint(
        first["family"], first["model"], first["seed"], first["step"], first["tokens_seen"], n_units, sites, tokens,
        exact,
    )  # fmt: skip


IDENTITY_COLUMNS = ("family", "model", "seed", "step", "tokens_seen")  # Checkpoint's first fields, in order


def unit_size(settings: dict) -> int:
    """Sequences per resampling unit, by extract's rule (extract.streaming.Units: consecutive sequences in groups of
    ceil(n_sequences / units)), so that the sampled vectors are drawn by the same units as units.parquet's sums;
    each sequence its own unit where extract kept no units (`units` 0, or results older than units.parquet)."""
    units = int(settings.get("units") or 0)
    return -(-int(settings["n_sequences"]) // units) if units > 0 else 1


def _groups(hidden: pl.DataFrame, scales: pl.Series | None = None) -> list[tuple[tuple[int, str], dict]]:
    """Each (layer, site)'s vectors (float32, as stored; table order, as metrics.sample_rows reads them), sequences,
    (seq, position, token_id) rows and, given int8's per-vector `scales` (hidden's rows), theirs."""
    groups = group_rows(hidden, ("layer", "site"))
    grouped = vectors_by_group(hidden, ("layer", "site"), ("vector",), groups, dtype=np.float32)  # as stored
    seq = hidden["seq"].to_numpy()
    tokens = hidden.select("seq", "position", "token_id").to_numpy()
    scales = None if scales is None else scales.to_numpy().astype(np.float64)
    return [
        (
            key,
            {"x": group["vector"], "seq": seq[rows], "tokens": tokens[rows]}
            | ({} if scales is None else {"scale": scales[rows]}),
        )
        for (key, group), (_, rows) in zip(grouped, groups)
    ]


def metric_values(
    path: Path, measures: Sequence[str], sites: Sequence[tuple[int, str]]
) -> dict[tuple[str, int, str], float]:
    """metrics.parquet's value of each of `measures` at each sampled (layer, site): the layer's row (head and the
    gradient analysis's parameters null); a null value is NaN."""
    if not measures:
        return {}
    if not path.exists():
        raise BootstrapInputError(
            f"{path}: missing; the bootstrap's estimates are the checkpoint's metrics values: rerun its metrics job"
        )
    table = read_parquet(path, columns=["layer", "head", "site", "metric", *METRIC_PARAMETERS, "value"]).filter(
        pl.col("metric").is_in(list(measures)), *(pl.col(c).is_null() for c in ("head", *METRIC_PARAMETERS))
    )
    values = {
        (r["metric"], r["layer"], r["site"]): np.nan if r["value"] is None else float(r["value"])
        for r in table.iter_rows(named=True)
    }
    wanted = [(metric, layer, site) for layer, site in sites for metric in measures]
    missing = [key for key in wanted if key not in values]
    if missing:
        metric, layer, site = missing[0]
        raise BootstrapInputError(
            f"{path}: no {metric} row at layer {layer} {site} ({len(missing)} of the sampled sites' values missing), "
            "though hidden.parquet samples it: the table is of another run or older code; rerun its metrics job"
        )
    return values


# --------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Settings:
    level: float = bootstrap.DEFAULT_LEVEL
    samples: int = bootstrap.DEFAULT_SAMPLES
    seed: int = 0
    measures: tuple[str, ...] = DEFAULT_MEASURES
    sink_epsilon: float = sum_bootstrap.EPSILON  # sink1_eps's threshold: metrics' (config sinks.epsilon)
    svcca_variance: float = 0.99  # the comparisons' (config compare.svcca_variance, compare.cca_max_width)
    cca_max_width: int | None = 1024

    @property
    def sampled(self) -> tuple[str, ...]:
        """The measures of the sampled vectors (hidden.parquet)."""
        return tuple(m for m in self.measures if m in MEASURES)

    @property
    def compared(self) -> tuple[str, ...]:
        """The comparisons of two steps' sampled vectors (pair_bootstrap)."""
        return tuple(m for m in pair_bootstrap.MEASURES if m in self.measures)

    @property
    def comparisons(self) -> compare.Settings:
        return compare.Settings(
            measures=self.compared, svcca_variance=self.svcca_variance, cca_max_width=self.cca_max_width
        )

    @property
    def summed(self) -> tuple[str, ...]:
        """The measures built of sums (units.parquet: anisweep.measures.sum_bootstrap)."""
        return tuple(m for m in self.measures if m in sum_bootstrap.MEASURES)

    def __post_init__(self):
        known = MEASURES + pair_bootstrap.MEASURES + sum_bootstrap.MEASURES
        unknown = sorted(set(self.measures) - set(known))
        if unknown:
            raise BootstrapInputError(f"measures {unknown}: not resampled here; choose among {list(known)}")
        if not 0 < self.level < 1:
            raise BootstrapInputError(f"level {self.level}: a confidence level lies strictly between 0 and 1 (0.95)")
        if self.samples < 1:
            raise BootstrapInputError(f"samples {self.samples}: B must be at least 1")


Key = tuple[str, int, str, "int | None"]  # metric, layer, site, head (None: per layer)


@dataclass(frozen=True)
class StepMeasure:
    """One measure of one step's checkpoints (one per seed): its key, the Multi-Bootstrap measure, the estimate (the
    mean over seeds of metrics' values) and its units (the sequences, or extract's resampling units)."""

    key: Key
    measure: bootstrap.Measure
    estimate: float
    n_units: int


def sampled_keys(reference: Checkpoint, measures: Sequence[str]) -> list[Key]:
    """The keys resampled from the sampled vectors: every measure at every sampled site."""
    return [(metric, layer, site, None) for layer, site in sorted(reference.sites) for metric in measures]


def sampled_measure(
    checkpoints: Sequence[Checkpoint], labels: Sequence[str], key: Key, shared: Sequence[str] = ()
) -> bootstrap.SampleBuilt:
    """The measure `key` of one step's checkpoints, one per seed, named by `labels`; `shared`: the site's other
    measures resampled on the same draws, computed with it from each replicate's moments (SiteSample.shared_values)."""
    metric, layer, site, _ = key
    return bootstrap.SampleBuilt(
        labels,
        checkpoints[0].n_units,
        lambda s, units: checkpoints[s].sites[(layer, site)].shared_values(metric, shared, units),
    )


def sampled_estimate(checkpoints: Sequence[Checkpoint], key: Key) -> float:
    """The mean over seeds of metrics' value of `key`: the estimate of a seed group."""
    return float(np.mean([c.exact.get(key[:3], np.nan) for c in checkpoints]))


def summed_measures(folders: Sequence[str | Path], labels: Sequence[str], settings: Settings) -> list[StepMeasure]:
    """The measures built of sums of one step's checkpoint folders (one per seed), from their units.parquet: each
    seed's units' statistics stacked (seeds x units x k), the estimate the mean of their full-sample values."""
    if not settings.summed:
        return []
    per_seed = [sum_bootstrap.read_units(folder, settings.summed, settings.sink_epsilon) for folder in folders]
    n_units = {n for n, _ in per_seed}
    keyed = [{m.key: m for m in measures} for _, measures in per_seed]
    if len(n_units) != 1 or any(k.keys() != keyed[0].keys() for k in keyed):
        raise BootstrapInputError(
            f"{list(folders)}: their units.parquet differ in units ({sorted(n_units)}) or in layers, sites and heads; "
            "a group's models must be of one shape, extracted with the same extract settings (extract.units)"
        )
    out = []
    for key, first in keyed[0].items():
        stats = [k[key].per_unit for k in keyed]
        if len({x.shape for x in stats}) != 1:
            raise BootstrapInputError(f"{key}: the seeds' statistics differ in shape {[x.shape for x in stats]}")
        measure = bootstrap.SumBuilt(np.stack(stats), first.of_sums, labels)
        out.append(StepMeasure(key, measure, float(np.mean([k[key].value for k in keyed])), per_seed[0][0]))
    return out


def step_measures(
    checkpoints: Sequence[Checkpoint], folders: Sequence[str | Path], labels: Sequence[str], settings: Settings
) -> list[StepMeasure]:
    """Every measure of `settings` at one step: the sampled vectors' (hidden.parquet) and the sums' (units.parquet)."""
    sampled = [
        StepMeasure(
            key,
            sampled_measure(checkpoints, labels, key, settings.sampled),
            sampled_estimate(checkpoints, key),
            c.n_units,
        )
        for c in checkpoints[:1]
        for key in sampled_keys(c, settings.sampled)
    ]
    return sampled + summed_measures(folders, labels, settings)


def check_same_sample(reference: Checkpoint, other: Checkpoint) -> None:
    """Resampled together, two checkpoints must have sampled the same tokens of the same sequences."""
    problem = None
    if other.n_units != reference.n_units:
        problem = f"{reference.n_units} against {other.n_units} evaluation sequences"
    elif set(other.tokens) != set(reference.tokens):
        problem = f"sites {sorted(reference.tokens)} against {sorted(other.tokens)}"
    else:
        differing = [k for k, t in reference.tokens.items() if not np.array_equal(t, other.tokens[k])]
        if differing:
            problem = f"other sampled tokens (seq, position, token_id) at layer {differing[0][0]}, {differing[0][1]}"
    if problem:
        raise BootstrapInputError(
            f"{reference.name} step {reference.step} and {other.name} step {other.step} were not measured on one "
            f"evaluation sample ({problem}): resampling pairs their sequences, so a group needs models of one "
            "tokenizer measured with the same extract settings; leave the other model out of the group"
        )


def _interval_row(estimate: float, scores: np.ndarray, level: float) -> dict:
    """The percentile interval of the replicates' scores, and their bias: their mean minus the estimate (where it is
    as large as the interval is wide, the interval sits beside the estimate: docs/measures.md)."""
    undefined = int(np.isnan(scores).sum())
    low, high = (np.nan, np.nan) if undefined else bootstrap.percentile_interval(scores, level)
    bias = np.nan if undefined else float(np.mean(scores)) - estimate
    return {"estimate": estimate, "low": low, "high": high, "bias": bias, "p": None, "undefined": undefined}


def _test_row(estimate: float, deltas: np.ndarray, level: float) -> dict:
    row = _interval_row(estimate, deltas, level)
    row["p"] = np.nan if row["undefined"] else bootstrap.two_sided_p(deltas)
    return row


def step_tests(steps: Sequence[int]) -> list[tuple[int, int, str]]:
    """(step, ref_step, against): each step against the one before it and against the final step."""
    ordered = sorted(set(steps))
    tests = [(b, a, "previous") for a, b in zip(ordered, ordered[1:])]
    return tests + [(s, ordered[-1], "final") for s in ordered[:-1]]


def bootstrap_table(
    seeds: Sequence[Sequence[str | Path]], settings: Settings = Settings(), group: str | None = None
) -> pl.DataFrame:
    """The intervals and step tests of one model (`seeds` one list of its checkpoint folders, in step order) or of a
    group (one list per seed, each seed's folders of the same steps), and where settings.compared asks for them the
    intervals of each step's comparisons with the previous and the final step (`comparisons`). Reads one step's
    checkpoints at a time; keeps each measure's replicate scores (B floats per measure, layer, site and step) for the
    tests."""
    if not seeds or not all(seeds):
        raise BootstrapInputError("no checkpoints to resample: give each seed's checkpoint folders")
    if len({len(folders) for folders in seeds}) != 1:
        raise BootstrapInputError(f"each seed needs the same steps: {[len(f) for f in seeds]} checkpoints per seed")
    blocks, reference, labels = {}, None, None
    estimates, scores, identity, n_units = {}, {}, {}, {}
    for step_folders in zip(*seeds):
        checkpoints = [read_checkpoint(folder, settings.sampled) for folder in step_folders]
        reference = reference or checkpoints[0]
        labels = labels or [c.name for c in checkpoints]
        if [c.name for c in checkpoints] != labels:
            raise BootstrapInputError(f"each step's checkpoints must be the seeds in one order: {labels}")
        if len({c.step for c in checkpoints}) != 1:
            raise BootstrapInputError(f"one step's checkpoints are of steps {sorted({c.step for c in checkpoints})}")
        for c in checkpoints:
            check_same_sample(reference, c)
        step = checkpoints[0].step
        if step in identity:
            raise BootstrapInputError(f"step {step} is given twice")
        identity[step] = checkpoints[0]
        for m in step_measures(checkpoints, step_folders, labels, settings):
            got, _ = bootstrap.replicates(m.measure, None, _draws(blocks, m.n_units, len(checkpoints), settings))
            scores[(*m.key, step)] = got
            estimates[(*m.key, step)] = m.estimate
            n_units[m.key] = m.n_units
    if settings.compared and list(identity) != sorted(identity):
        raise BootstrapInputError(
            f"steps {list(identity)}: give each seed's checkpoint folders in step order for the comparisons of a step "
            "with the previous one"
        )
    pairs = comparisons(seeds, settings, blocks) if settings.compared else {}
    return _rows(estimates, scores, identity, labels, n_units, settings, group, pairs)


def _draws(blocks: dict, n_units: int, n_seeds: int, settings: Settings) -> list[bootstrap.Draws]:
    """The draws of `n_units` units and `n_seeds` seeds: the same for every step, layer and measure of as many units."""
    if n_units not in blocks:
        blocks[n_units] = list(bootstrap.draws(n_units, n_seeds, samples=settings.samples, seed=settings.seed))
    return blocks[n_units]


def comparisons(seeds: Sequence[Sequence[str | Path]], settings: Settings, blocks: dict) -> dict:
    """{(metric, layer, site, step, against): (ref_step, estimate, replicate scores, units)} of every comparison of
    settings.compared of each step with the previous and the final step, at every sampled site: each seed's values on
    every draw of units (seed_comparisons), then each replicate's score the mean over its drawn seeds; the estimate
    the mean over seeds of their values on the whole samples."""
    per_seed = [seed_comparisons(folders, settings, lambda units: _draws(blocks, units, len(seeds), settings))
                for folders in seeds]  # fmt: skip
    out = {}
    for key, (ref_step, _, _, units) in per_seed[0].items():
        draws = _draws(blocks, units, len(seeds), settings)
        estimate = float(np.mean([seed[key][1] for seed in per_seed]))
        out[key] = (ref_step, estimate, seed_scores(per_seed, key, draws), units)
    return out


def seed_comparisons(folders: Sequence[str | Path], settings: Settings, draws_of: Callable) -> dict:
    """{(metric, layer, site, step, against): (ref_step, estimate, [values on each block of draws], units)} of one
    seed's checkpoints (`folders`, in step order): each against the previous and the final one, on every block of
    `draws_of(n_units)`. Three checkpoints' samples are held at once (the step's, the previous and the final
    step's)."""
    values, final, previous = {}, read_checkpoint(folders[-1], settings.compared), None
    for folder in folders:
        current = final if folder == folders[-1] else read_checkpoint(folder, settings.compared)
        for against, ref in (("previous", previous), ("final", final)):
            if ref is None or ref is current:
                continue
            for layer, site in sorted(current.sites):
                pair = Pair(current.sites[(layer, site)].pair, ref.sites[(layer, site)].pair, settings.comparisons)
                by_block = [pair.values(block.units) for block in draws_of(pair.n_units)]
                for metric, estimate in pair.estimates().items():
                    got = [block[metric] for block in by_block]
                    values[(metric, layer, site, current.step, against)] = (ref.step, estimate, got, pair.n_units)
        previous = current
    return values


def seed_scores(per_seed: Sequence[dict], key: tuple, draws: Sequence[bootstrap.Draws], side: str = "base"):
    """Each replicate's score of `key`: the mean over the seeds it draws (the draws' `side`) of their values."""
    by_block = zip(*(seed[key][2] for seed in per_seed))
    return np.concatenate(
        [bootstrap.seed_means(np.stack(values, axis=1), getattr(d, side)) for values, d in zip(by_block, draws)]
    )


def _order(key: tuple) -> tuple:
    """Rows by layer, site, metric, head (the layer's own first), step."""
    metric, layer, site, head, step = key
    return (layer, site, metric, -1 if head is None else head, step)


def _rows(estimates, scores, identity, labels, n_units, settings, group, pairs) -> pl.DataFrame:
    n_seeds = len(labels)
    alone = n_seeds == 1 and group is None
    first = identity[min(identity)]
    common = {
        "group": group,
        "models": labels,
        "family": first.family if len({name.split("/")[0] for name in labels}) == 1 else None,
        "model": first.model if alone else None,
        "seed": first.seed if alone else None,
        "level": settings.level,
        "n_seeds": n_seeds,
        "samples": settings.samples,
    }
    steps = sorted(identity)
    rows = []
    for metric, layer, site, head, step in sorted(estimates, key=_order):
        key = (metric, layer, site, head)
        where = {"layer": layer, "site": site, "head": head, "metric": metric, "n_units": n_units[key]}
        rows.append(
            common
            | where
            | {"step": step, "tokens_seen": identity[step].tokens_seen, "against": None, "ref_step": None}
            | {"design": "seeds and units" if n_seeds > 1 else "units"}
            | _interval_row(estimates[(*key, step)], scores[(*key, step)], settings.level)
        )
        if step != steps[-1]:
            continue
        for test_step, ref_step, against in step_tests(steps):
            difference = estimates[(*key, test_step)] - estimates[(*key, ref_step)]
            deltas = scores[(*key, test_step)] - scores[(*key, ref_step)]
            rows.append(
                common
                | where
                | {"step": test_step, "tokens_seen": identity[test_step].tokens_seen}
                | {"against": against, "ref_step": ref_step, "design": "paired"}
                | _test_row(difference, deltas, settings.level)
            )
    for (metric, layer, site, step, against), (ref_step, estimate, got, units) in pairs.items():
        where = {"layer": layer, "site": site, "head": None, "metric": metric, "n_units": units}
        rows.append(
            common
            | where
            | {"step": step, "tokens_seen": identity[step].tokens_seen, "against": against, "ref_step": ref_step}
            | {"design": "seeds and units" if n_seeds > 1 else "units"}
            | _interval_row(estimate, got, settings.level)
        )
    table = pl.DataFrame(rows, schema=SCHEMA)
    return table.sort("layer", "site", "metric", "head", "against", "step", nulls_last=False)
