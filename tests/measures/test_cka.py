"""Linear CKA from d x d cross-products against the Gram-matrix formulas on small samples: the biased HSIC as
tr(K H L H) of the raw (uncentred) features' n x n kernels, the unbiased one as Song et al. 2012's U-statistic on the
centred features' kernels with their diagonals zeroed; and the invariances CKA is defined by."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anisweep.measures.cka import cka_matrix, linear_cka


def gram_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    n = len(k)
    h = np.eye(n) - np.ones((n, n)) / n
    return float(np.trace(k @ h @ l @ h)) / (n - 1) ** 2


def song_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    n = len(k)
    k, l = k.copy(), l.copy()  # noqa: E741
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(l, 0.0)
    ones = np.ones(n)
    value = (
        np.trace(k @ l)
        + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
        - 2 / (n - 2) * (ones @ k @ l @ ones)
    )
    return float(value) / (n * (n - 3))


def gram_cka(x: np.ndarray, y: np.ndarray, debiased: bool) -> float:
    if debiased:
        x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    k, l = x @ x.T, y @ y.T  # noqa: E741
    hsic = song_hsic if debiased else gram_hsic
    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def pair(n=30, d1=7, d2=5, seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d1)) * np.linspace(0.5, 3, d1) + 2.0  # drifted, anisotropic
    y = np.tanh(x @ rng.standard_normal((d1, d2)) / d1) + 0.3 * rng.standard_normal((n, d2)) - 1.0
    return x, y


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize(("n", "d1", "d2"), [(30, 7, 5), (6, 9, 3), (50, 4, 12)])
def test_cka_equals_the_gram_matrix_formula(debiased, n, d1, d2):
    x, y = pair(n, d1, d2)
    assert linear_cka(x, y, debiased) == pytest.approx(gram_cka(x, y, debiased), rel=1e-10)


def test_cka_of_a_rotated_scaled_shifted_copy_is_one_and_symmetric():
    x, y = pair()
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((7, 7)))
    for debiased in (False, True):
        assert linear_cka(x, 3.0 * x @ q + 5.0, debiased) == pytest.approx(1.0)
        assert linear_cka(x, y, debiased) == pytest.approx(linear_cka(y, x, debiased))


def test_unbiased_cka_of_independent_representations_is_near_zero_where_the_biased_is_not():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((40, 30)), rng.standard_normal((40, 30))
    assert abs(linear_cka(x, y, debiased=True)) < 0.1 < linear_cka(x, y)


def test_the_layer_by_layer_matrix_is_each_pairs_cka():
    x, y = pair()
    z = np.random.default_rng(3).standard_normal((30, 4))
    matrix = cka_matrix([x, y, z], debiased=True)
    assert matrix[0, 0] == pytest.approx(1.0) and np.allclose(matrix, matrix.T)
    assert matrix[1, 2] == pytest.approx(linear_cka(y, z, debiased=True))


def test_mismatched_or_too_few_tokens_are_errors_naming_them():
    x, y = pair()
    with pytest.raises(ValueError, match="30 rows against 29"):
        linear_cka(x, y[:29])
    with pytest.raises(ValueError, match="at least 4 tokens, got 3"):
        linear_cka(x[:3], y[:3], debiased=True)
    assert math.isnan(linear_cka(np.ones((5, 3)), y[:5]))
