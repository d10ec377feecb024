"""IsoScore of any reweighting of a site's resampling units, from products of the units' vectors computed once: no
d x d matrix per replicate, so the Multi-Bootstrap of IsoScore costs about one pass over the sample, not B of them
(anisweep.measures.sample_bootstrap; docs/measures.md, Uncertainty over seeds and sequences).

IsoScore is a function of the covariance's trace and squared Frobenius norm alone
(isoscore_of_trace, below). With the vectors shifted by the sample's mean (which leaves every scatter
matrix as it is), unit u's count n_u, sum T_u and Gram matrix G_u, a replicate drawing unit u c_u times has
n = c.n, t = sum_u c_u T_u, G = sum_u c_u G_u and the scatter S = G - t t' / n, so

    tr S    = c.tr(G_u) - t't / n
    ||S||^2 = ||G||^2 - 2 t'Gt / n + (t't)^2 / n^2,   ||G||^2 = c'Kc,   t'Gt = sum_u c_u c'C_u c

with K_uv = <G_u, G_v> (the Frobenius product) and C_u[v, w] = sum_{i in u} (x_i . T_v)(x_i . T_w): a replicate
costs O(units^3), whatever d and the number of vectors.
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
    `sums` T_u and `traces` tr(G_u) of the shifted ones, `gram_products` K and `cross` C."""

    d: int
    sizes: np.ndarray
    raw_traces: np.ndarray
    sums: np.ndarray
    traces: np.ndarray
    gram_products: np.ndarray
    cross: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, unit: np.ndarray, n_units: int) -> UnitProducts:
        """From the (rows, d) vectors and each row's unit in 0 .. n_units - 1. The units' Gram matrices and K are
        float32 matrix products of the float32 vectors (as hidden.parquet stores them) shifted by their mean, at
        about half the cost of float64's; the rest is float64. A replicate's participation ratio tr(S)^2 / ||S||^2
        (1 + IsoScore (d - 1)) is then within 2e-5 of the float64 eigenvalues' (tests/measures/test_sample_bootstrap.py,
        on 6-dimensional clouds far from isotropic, where IsoScore is that ratio's small excess over 1)."""
        unit = np.asarray(unit, dtype=np.int64)
        x = np.asarray(x, dtype=np.float32)
        if np.any(unit[1:] < unit[:-1]):  # each unit's rows together
            order = np.argsort(unit, kind="stable")
            unit, x = unit[order], x[order]
        bounds = np.searchsorted(unit, np.arange(n_units + 1))
        shift = x.mean(axis=0, dtype=np.float64).astype(np.float32) if len(x) else np.zeros(x.shape[1], np.float32)
        shifted = x - shift  # any shift leaves the scatter as it is; the mean's keeps the products small
        sums = np.stack([shifted[bounds[u] : bounds[u + 1]].sum(axis=0, dtype=np.float64) for u in range(n_units)])
        projections = shifted.astype(np.float64) @ sums.T  # (rows, units): x_i . T_v
        cross = np.zeros((n_units, n_units, n_units))
        for u in range(n_units):
            p = projections[bounds[u] : bounds[u + 1]]
            cross[u] = p.T @ p
        return cls(
            d=x.shape[1],
            sizes=np.diff(bounds).astype(np.float64),
            raw_traces=np.bincount(unit, weights=np.einsum("ij,ij->i", x, x, dtype=np.float64), minlength=n_units),
            sums=sums,
            traces=np.bincount(
                unit, weights=np.einsum("ij,ij->i", shifted, shifted, dtype=np.float64), minlength=n_units
            ),
            gram_products=gram_products(shifted, bounds),
            cross=cross,
        )

    def isoscore(self, counts: np.ndarray) -> np.ndarray:
        """IsoScore of each row of the (b, units) counts, NaN where metrics.sample_rows gives NaN: fewer than d or 2
        vectors, or no spread (relative spread below geometry.SPREAD_TOLERANCE)."""
        n = counts @ self.sizes
        safe = np.maximum(n, 1.0)
        t = counts @ self.sums
        tt = np.einsum("bd,bd->b", t, t)
        trace = counts @ self.traces - tt / safe
        gg = np.einsum("bu,uv,bv->b", counts, self.gram_products, counts)
        k = len(self.sizes)
        weighted = (counts @ self.cross.reshape(k, k * k)).reshape(-1, k, k)
        tgt = np.einsum("bvw,bv,bw->b", weighted, counts, counts)
        squared_norm = np.maximum(gg - 2.0 * tgt / safe + (tt / safe) ** 2, 0.0)
        raw = counts @ self.raw_traces
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = np.where(raw > 0, trace / raw, np.nan)
        ok = (n >= 2) & (n >= self.d) & (self.d >= 2) & (np.nan_to_num(spread, nan=-1.0) >= geometry.SPREAD_TOLERANCE)
        out = np.full(len(counts), np.nan)
        out[ok] = isoscore_of_trace(trace[ok], squared_norm[ok], self.d)
        return out


def isoscore_of_trace(trace: np.ndarray, squared_norm: np.ndarray, d: int) -> np.ndarray:
    """geometry.isoscore_of_variances from the eigenvalues' sum t and squared norm F^2 (a matrix's trace and squared
    Frobenius norm): lam_hat = sqrt(d) lam / F has ||lam_hat||^2 = d and sum lam_hat = sqrt(d) t / F, so
    delta^2 (d - sqrt(d)) = d - sqrt(d) t / F, k = t^2 / (d F^2) and IsoScore = (t^2 / F^2 - 1) / (d - 1): the
    eigenvalues' participation ratio t^2 / F^2 (in [1, d]; a rounding past either end is that end), rescaled. NaN
    where F is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.clip(trace * trace / squared_norm, 1.0, d)
        return np.where(squared_norm > 0, (ratio - 1.0) / (d - 1.0), np.nan)


def gram_products(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """K_uv = <X_u'X_u, X_v'X_v> = ||X_u X_v'||^2 for the units' rows X_u = x[bounds[u]:bounds[u + 1]], in x's
    precision, as float64: from the units' d x d Gram matrices where they fit MAX_UNIT_GRAM_ELEMENTS, else from each
    unit's products with every row (rows^2 x d operations instead of rows x d^2)."""
    n_units, d = len(bounds) - 1, x.shape[1]
    if n_units * d * d <= MAX_UNIT_GRAM_ELEMENTS:
        grams = np.zeros((n_units, d, d), dtype=x.dtype)
        for u in range(n_units):
            rows = x[bounds[u] : bounds[u + 1]]
            np.matmul(rows.T, rows, out=grams[u])
        flat = grams.reshape(n_units, d * d)
        return (flat @ flat.T).astype(np.float64)
    k = np.zeros((n_units, n_units))
    for u in range(n_units):
        products = x @ x[bounds[u] : bounds[u + 1]].T  # (rows, rows of u)
        squared = np.einsum("ij,ij->i", products, products, dtype=np.float64)
        k[:, u] = [squared[bounds[v] : bounds[v + 1]].sum() for v in range(n_units)]
    return k
