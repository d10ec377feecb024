"""The comparative measures of two steps' samples (anisweep.measures.compare: linear CKA, SVCCA, PWCCA), resampled
by extract's units: each step of a model or a group against the previous and the final step, at every sampled
(layer, site), a replicate drawing the same units for both steps and every seed. Both samples hold the same tokens
(the bootstrap checks it), so a drawn unit brings the same rows of both.

- CKA is ||S_xy||^2 / (||S_xx|| ||S_yy||), each squared norm a polynomial in the units' counts (unit_products): a
  replicate costs O(units^3) once the pair's products are computed (one pass of d1 x d2 products over its sample).
- SVCCA and PWCCA are compare.svcca_of and pwcca_of on each replicate's centred cross-products sum_u c_u X_u'Y_u, so
  an eigendecomposition of each side and an SVD per replicate: tens of times extract's cost at a real width.

The estimate is the value on the whole sample, the mean over seeds for a group: SVCCA's and PWCCA's compare's own
(compare.builtin_rows, on the same float32 vectors), CKA's from the same products as its replicates at unit weights
(within 1e-6 of compare's float64 value, 3e-9 to 7e-8 measured at 8,192 tokens of 768 dimensions, about a small and a
large mean: a float64 product of the two samples would cost more than the pair's replicates). The replicates read
each side's rounding floor (compare.rounding_bound) from its units' own bounds, sqrt(sum_u c_u r_u^2), a bound on the
replicate's rounding since rounding is per value. cka_debiased is not resampled.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from anisweep.measures import bootstrap, compare
from anisweep.measures.unit_products import ScatterProducts, UnitProducts, by_unit

MEASURES = ("cka", "svcca", "pwcca")
#: at most this many float64s of the units' three d x d cross-products are held per pair (256 MiB): past it, each
#: replicate's are summed from the weighted vectors (slower, no more memory than the vectors)
MAX_UNIT_GRAM_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class PairSide:
    """One checkpoint's sample at one (layer, site) as the comparisons read it: its float32 vectors with each unit's
    rows together (`bounds[u]:bounds[u + 1]`), whether every sampled row was finite (else every comparison is NaN,
    as compare's), what its rounding bound (compare.rounding_bound) needs, and its UnitProducts for CKA."""

    x: np.ndarray
    bounds: np.ndarray
    complete: bool
    products: UnitProducts | None
    dtype: str | None = None
    storage: str = "float32"
    scales: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        x: np.ndarray,
        unit: np.ndarray,
        n_units: int,
        *,
        dtype: str | None = None,
        storage: str = "float32",
        scales: np.ndarray | None = None,
        products: UnitProducts | None = None,
        cka: bool = True,
    ) -> PairSide:
        """From every sampled row (table order) of the site, each row's unit, extract's dtype and the sample's storage
        (`scales`: int8's per-vector scales); `products`: the site's UnitProducts where IsoScore built them."""
        complete = bool(np.isfinite(x).all())
        if scales is None:
            unit, (x,) = by_unit(unit, x)
        else:
            unit, (x, scales) = by_unit(unit, x, scales)
        bounds = np.searchsorted(unit, np.arange(n_units + 1))
        if complete and cka and products is None:
            products = UnitProducts.of(x, unit, n_units)
        return cls(x, bounds, complete, products if complete else None, dtype, storage, scales)

    def rounding(self, rows: slice = slice(None)) -> float:
        """compare.rounding_bound of the rows (all: the whole sample's)."""
        scales = None if self.scales is None else self.scales[rows]
        return compare.rounding_bound(self.x[rows].astype(np.float64), self.dtype, self.storage, scales)

    @functools.cached_property
    def unit_rounding(self) -> np.ndarray:
        """Each unit's rounding bound r_u: a replicate's is sqrt(sum_u c_u r_u^2)."""
        return np.array([self.rounding(slice(a, b)) for a, b in zip(self.bounds[:-1], self.bounds[1:])])

    @property
    def shifted(self) -> np.ndarray:
        return self.x - self.products.shift


@dataclass
class Pair:
    """One seed's checkpoint against its reference at one (layer, site): the comparisons of any draws of units."""

    x: PairSide
    y: PairSide
    settings: compare.Settings

    @property
    def n_units(self) -> int:
        return len(self.x.bounds) - 1

    def estimates(self) -> dict[str, float]:
        """Each measure on the whole samples (NaN where compare's is): CKA from the units' products at unit weights
        (as its replicates, within 1e-6 of compare's float64 value), SVCCA and PWCCA compare.builtin_rows' values."""
        out = {}
        if "cka" in self.settings.measures:
            complete = self.x.complete and self.y.complete
            out["cka"] = float(self._cka(np.ones((1, self.n_units)))[0]) if complete else np.nan
        cca = dataclasses.replace(self.settings, measures=tuple(m for m in self.settings.measures if m != "cka"))
        if cca.cca_measures(max(self.x.x.shape[1], self.y.x.shape[1])):
            x, y = self.x.x.astype(np.float64), self.y.x.astype(np.float64)
            rounding = (self.x.rounding(), self.y.rounding()) if self.x.complete and self.y.complete else (0.0, 0.0)
            out |= {r["metric"]: r["value"] for r in compare.builtin_rows(x, y, cca, rounding)}
        return out

    def values(self, units: np.ndarray) -> dict[str, np.ndarray]:
        """Each measure on each row of `units` (draws x n_units unit indices), all from the same counts (the CCA
        measures share each replicate's cross-products)."""
        counts = bootstrap.unit_counts(units, self.n_units)
        measures = [m for m in self.settings.measures if m in MEASURES]
        out = {m: np.full(len(counts), np.nan) for m in measures}
        if not (self.x.complete and self.y.complete):
            return out
        if "cka" in out:
            out["cka"] = self._cka(counts)
        cca = [m for m in self.settings.cca_measures(max(self.x.x.shape[1], self.y.x.shape[1])) if m in out]
        for r, c in enumerate(counts if cca else ()):
            products = self._replicate_products(c)
            for name in cca:
                value = compare.cca_value(name, products, self.settings)[0]
                out[name][r] = np.nan if value is None else value
        return out

    def _cka(self, counts: np.ndarray) -> np.ndarray:
        a, b = self.x.products, self.y.products
        xy = self._scatter.squared_norm(counts, a.sizes, a.sums, b.sums)
        xx, yy = a.squared_norm(counts), b.squared_norm(counts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where((xx > 0) & (yy > 0), xy / np.sqrt(xx * yy), np.nan)

    @functools.cached_property
    def _scatter(self) -> ScatterProducts:
        """The products that CKA's numerator ||S_xy||^2 needs (unit_products)."""
        a, b = self.x.products, self.y.products
        return ScatterProducts.of(self.x.shifted, self.y.shifted, self.x.bounds, a.sums, b.sums)

    @functools.cached_property
    def _mean_x(self) -> np.ndarray:
        return self.x.x.mean(axis=0, dtype=np.float64)

    @functools.cached_property
    def _centred(self) -> tuple[np.ndarray, np.ndarray]:
        """Both samples (float64) less their means."""
        return self.x.x.astype(np.float64) - self._mean_x, self.y.x.astype(np.float64) - self.y.x.mean(0, np.float64)

    @functools.cached_property
    def _unit_sums(self) -> tuple[np.ndarray, np.ndarray]:
        return tuple(np.add.reduceat(side, self.x.bounds[:-1], axis=0) for side in self._centred)

    @functools.cached_property
    def _unit_products(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Each unit's X_u'X_u, X_u'Y_u and Y_u'Y_u of the centred samples, where they fit MAX_UNIT_GRAM_ELEMENTS;
        None past it."""
        d1, d2 = self.x.x.shape[1], self.y.x.shape[1]
        if self.n_units * (d1 + d2) ** 2 > MAX_UNIT_GRAM_ELEMENTS:
            return None
        x, y = self._centred
        units = [slice(self.x.bounds[u], self.x.bounds[u + 1]) for u in range(self.n_units)]
        return tuple(np.stack([a[rows].T @ b[rows] for rows in units]) for a, b in ((x, x), (x, y), (y, y)))

    def _replicate_products(self, counts: np.ndarray) -> compare.CrossProducts:
        """compare.CrossProducts of the samples with unit u's rows repeated counts[u] times (the rows' norms left
        out: SVCCA and PWCCA do not read them)."""
        n = float(counts @ np.diff(self.x.bounds))
        tx, ty = (sums.T @ counts for sums in self._unit_sums)
        if self._unit_products is not None:
            xx, xy, yy = (np.tensordot(counts, g, axes=(0, 0)) for g in self._unit_products)
        else:
            x, y = self._centred
            w = np.repeat(counts, np.diff(self.x.bounds))[:, None]
            xx, xy, yy = (w * x).T @ x, (w * x).T @ y, (w * y).T @ y
        return compare.CrossProducts(
            int(round(n)), self._mean_x + tx / n,
            xx - np.outer(tx, tx) / n, xy - np.outer(tx, ty) / n, yy - np.outer(ty, ty) / n,
            np.zeros(0), np.zeros(0),
            float(np.sqrt(counts @ np.square(self.x.unit_rounding))),
            float(np.sqrt(counts @ np.square(self.y.unit_rounding))),
        )  # fmt: skip
