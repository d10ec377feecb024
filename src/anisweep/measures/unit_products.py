"""IsoScore and linear CKA of any reweighting of a site's resampling units, from products of the units' vectors
computed once: no d x d matrix per replicate, so the Multi-Bootstrap of either costs about one pass over the sample,
not B of them (anisweep.measures.sample_bootstrap, pair_bootstrap; docs/measures.md, Uncertainty over seeds and
sequences).

IsoScore is a function of the covariance's trace and squared Frobenius norm alone
(isoscore_of_trace, below). With the vectors shifted by the sample's mean (which leaves every scatter
matrix as it is), unit u's count n_u, sum T_u and Gram matrix G_u, a replicate drawing unit u c_u times has
n = c.n, t = sum_u c_u T_u, G = sum_u c_u G_u and the scatter S = G - t t' / n, so

    tr S    = c.tr(G_u) - t't / n
    ||S||^2 = ||G||^2 - 2 t'Gt / n + (t't)^2 / n^2,   ||G||^2 = c'Kc,   t'Gt = sum_u c_u c'C_u c

with K_uv = <G_u, G_v> (the Frobenius product) and C_u[v, w] = sum_{i in u} (x_i . T_v)(x_i . T_w): a replicate
costs O(units^3), whatever d and the number of vectors. Linear CKA is ||S_xy||^2 / (||S_xx|| ||S_yy||) with S_xy the
scatter between two samples of the same tokens (two steps'), whose squared norm has the same form (ScatterProducts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anisweep.measures import geometry

#: at most this many entries of the units' Gram matrices (float32: 128 MiB) are held at once: past it, K is summed
#: from the products of the vectors with each unit's vectors (rows^2 x d operations instead of rows x d^2)
MAX_UNIT_GRAM_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class UnitProducts:
    """The products of one site's sampled vectors that IsoScore's replicates need, per resampling unit (see the
    module's docstring): `sizes` n_u, `raw_traces` sum ||x||^2 of the unshifted vectors (the spread's mask),
    `sums` T_u and `traces` tr(G_u) of the vectors shifted by `shift` (their mean), and `scatter` (K and C)."""

    d: int
    sizes: np.ndarray
    raw_traces: np.ndarray
    shift: np.ndarray
    sums: np.ndarray
    traces: np.ndarray
    scatter: ScatterProducts

    @classmethod
    def of(cls, x: np.ndarray, unit: np.ndarray, n_units: int) -> UnitProducts:
        """From the (rows, d) vectors and each row's unit in 0 .. n_units - 1. The units' Gram matrices and K are
        float32 matrix products of the float32 vectors (as hidden.parquet stores them) shifted by their mean, at
        about half the cost of float64's; the rest is float64. A replicate's participation ratio tr(S)^2 / ||S||^2
        (1 + IsoScore (d - 1)) is then within 2e-5 of the float64 eigenvalues' (tests/measures/test_sample_bootstrap.py,
        on 6-dimensional clouds far from isotropic, where IsoScore is that ratio's small excess over 1)."""
        unit, (x,) = by_unit(unit, x)
        bounds = np.searchsorted(unit, np.arange(n_units + 1))
        shift = x.mean(axis=0, dtype=np.float64).astype(np.float32) if len(x) else np.zeros(x.shape[1], np.float32)
        shifted = x - shift  # any shift leaves the scatter as it is; the mean's keeps the products small
        sums = unit_sums(shifted, bounds)
        return cls(
            d=x.shape[1],
            sizes=np.diff(bounds).astype(np.float64),
            raw_traces=np.bincount(unit, weights=np.einsum("ij,ij->i", x, x, dtype=np.float64), minlength=n_units),
            shift=shift,
            sums=sums,
            traces=np.bincount(
                unit, weights=np.einsum("ij,ij->i", shifted, shifted, dtype=np.float64), minlength=n_units
            ),
            scatter=ScatterProducts.of(shifted, shifted, bounds, sums, sums),
        )

    def squared_norm(self, counts: np.ndarray) -> np.ndarray:
        """||S||_F^2 of each row of the (b, units) counts."""
        return self.scatter.squared_norm(counts, self.sizes, self.sums, self.sums)

    def isoscore(self, counts: np.ndarray) -> np.ndarray:
        """IsoScore of each row of the (b, units) counts, NaN where metrics.sample_rows gives NaN: fewer than d or 2
        vectors, or no spread (relative spread below geometry.SPREAD_TOLERANCE)."""
        n = counts @ self.sizes
        t = counts @ self.sums
        trace = counts @ self.traces - np.einsum("bd,bd->b", t, t) / np.maximum(n, 1.0)
        squared_norm = self.squared_norm(counts)
        raw = counts @ self.raw_traces
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = np.where(raw > 0, trace / raw, np.nan)
        ok = (n >= 2) & (n >= self.d) & (self.d >= 2) & (np.nan_to_num(spread, nan=-1.0) >= geometry.SPREAD_TOLERANCE)
        out = np.full(len(counts), np.nan)
        out[ok] = isoscore_of_trace(trace[ok], squared_norm[ok], self.d)
        return out


@dataclass(frozen=True)
class ScatterProducts:
    """What ||S_xy||_F^2 of any reweighting of the units needs, S_xy = sum c_u X_u'Y_u - t_x t_y' / n the scatter
    between two samples of the same rows (x against itself: the covariance's; two steps' samples: CKA's numerator),
    both shifted: K_uv = <X_u'Y_u, X_v'Y_v> and C_v[u, w] = sum_{i in v} (x_i . Tx_u)(y_i . Ty_w), so that

        ||S_xy||^2 = c'Kc - 2 sum_v c_v c'C_v c / n + ||t_x||^2 ||t_y||^2 / n^2."""

    gram_products: np.ndarray
    cross: np.ndarray

    @classmethod
    def of(
        cls, x: np.ndarray, y: np.ndarray, bounds: np.ndarray, sums_x: np.ndarray, sums_y: np.ndarray
    ) -> ScatterProducts:
        """From the shifted rows x (rows, d1) and y (rows, d2) of the units bounds[u]:bounds[u + 1] and each
        unit's sums of them."""
        n_units = len(bounds) - 1
        px = x.astype(np.float64) @ sums_x.T  # (rows, units): x_i . Tx_v
        py = px if y is x else y.astype(np.float64) @ sums_y.T
        cross = np.zeros((n_units, n_units, n_units))
        for v in range(n_units):
            rows = slice(bounds[v], bounds[v + 1])
            cross[v] = px[rows].T @ py[rows]
        return cls(gram_products(x, y, bounds), cross)

    def squared_norm(self, counts: np.ndarray, sizes: np.ndarray, sums_x: np.ndarray, sums_y: np.ndarray) -> np.ndarray:
        """||S_xy||_F^2 of each row of the (b, units) counts, clipped at 0 (rounding)."""
        safe = np.maximum(counts @ sizes, 1.0)
        tx, ty = counts @ sums_x, counts @ sums_y
        txx = np.einsum("bd,bd->b", tx, tx)
        tyy = txx if sums_y is sums_x else np.einsum("bd,bd->b", ty, ty)
        gg = np.einsum("bu,uv,bv->b", counts, self.gram_products, counts)
        k = len(sizes)
        weighted = (counts @ self.cross.reshape(k, k * k)).reshape(-1, k, k)
        middle = np.einsum("buw,bu,bw->b", weighted, counts, counts)
        return np.maximum(gg - 2.0 * middle / safe + txx * tyy / safe**2, 0.0)


def by_unit(unit: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The units and the arrays' rows (float32) with each unit's rows together, in their order within it."""
    unit = np.asarray(unit, dtype=np.int64)
    arrays = tuple(np.asarray(a, dtype=np.float32) for a in arrays)
    if np.any(unit[1:] < unit[:-1]):
        order = np.argsort(unit, kind="stable")
        return unit[order], tuple(a[order] for a in arrays)
    return unit, arrays


def unit_sums(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """(units, d) float64 sums of each unit's rows."""
    return np.stack([x[bounds[u] : bounds[u + 1]].sum(axis=0, dtype=np.float64) for u in range(len(bounds) - 1)])


def isoscore_of_trace(trace: np.ndarray, squared_norm: np.ndarray, d: int) -> np.ndarray:
    """geometry.isoscore_of_variances from the eigenvalues' sum t and squared norm F^2 (a matrix's trace and squared
    Frobenius norm): lam_hat = sqrt(d) lam / F has ||lam_hat||^2 = d and sum lam_hat = sqrt(d) t / F, so
    delta^2 (d - sqrt(d)) = d - sqrt(d) t / F, k = t^2 / (d F^2) and IsoScore = (t^2 / F^2 - 1) / (d - 1): the
    eigenvalues' participation ratio t^2 / F^2 (in [1, d]; a rounding past either end is that end), rescaled. NaN
    where F is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.clip(trace * trace / squared_norm, 1.0, d)
        return np.where(squared_norm > 0, (ratio - 1.0) / (d - 1.0), np.nan)


def gram_products(x: np.ndarray, y: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """K_uv = <X_u'Y_u, X_v'Y_v> = sum_{i in u, j in v} (x_i . x_j)(y_i . y_j) for the units' rows
    X_u = x[bounds[u]:bounds[u + 1]] (Y_u of y likewise), in x's precision, as float64: from the units' d1 x d2
    products where they fit MAX_UNIT_GRAM_ELEMENTS, else from each unit's products with every row (rows^2 x d
    operations instead of rows x d^2)."""
    n_units, d1, d2 = len(bounds) - 1, x.shape[1], y.shape[1]
    if n_units * d1 * d2 <= MAX_UNIT_GRAM_ELEMENTS:
        products = np.zeros((n_units, d1, d2), dtype=x.dtype)
        for u in range(n_units):
            rows = slice(bounds[u], bounds[u + 1])
            np.matmul(x[rows].T, y[rows], out=products[u])
        flat = products.reshape(n_units, d1 * d2)
        return (flat @ flat.T).astype(np.float64)
    k = np.zeros((n_units, n_units))
    for u in range(n_units):
        rows = slice(bounds[u], bounds[u + 1])
        px = x @ x[rows].T  # (rows, rows of u)
        py = px if y is x else y @ y[rows].T
        per_row = np.einsum("ij,ij->i", px, py, dtype=np.float64)
        k[:, u] = [per_row[bounds[v] : bounds[v + 1]].sum() for v in range(n_units)]
    return k
