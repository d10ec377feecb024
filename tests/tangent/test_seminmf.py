"""Semi-NMF (anisweep.tangent.seminmf): the default fit is converged (planted optimum and subspace reached,
`converged` within the default cap, a warning at the cap), deterministic, G >= 0, and its exact NNLS agrees with
scipy's. The multiplicative updates it replaced are kept as a solver, and shown here not to converge at the old
caps (100 in config/config.yaml, 200 the schema's default before)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import nnls

from anisweep.tangent.seminmf import (
    MAX_ITER,
    SemiNMFConvergenceWarning,
    _solve_passive,
    nnls_rows,
    principal_angles,
    semi_nmf,
    semi_nmf_als,
)
from anisweep.tangent.settings import GradientSettings


def planted(n=400, d=30, k=5, noise=0.0, seed=1):
    """X = G0 F0^T + noise (relative to the rms of G0 F0^T); returns x, F0 and the noise floor ||X - G0 F0^T|| / ||X||,
    an upper bound on the optimal relative error."""
    rng = np.random.default_rng(seed)
    f = rng.normal(size=(d, k))
    g = np.maximum(rng.normal(size=(n, k)), 0)
    clean = g @ f.T
    x = clean + noise * np.sqrt(np.mean(clean**2)) * rng.normal(size=clean.shape)
    return x, f, float(np.linalg.norm(x - clean) / np.linalg.norm(x))


def activation_like(n=1024, d=64, seed=0):
    """Mixed-sign, heavy-tailed, anisotropic rows with a common offset, like a transformer's residual stream."""
    rng = np.random.default_rng(seed)
    spectrum = 1 / np.arange(1, d + 1) ** 0.7
    rotation = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return (rng.standard_t(4, size=(n, d)) * spectrum) @ rotation.T + 6 * spectrum.mean() * rng.normal(size=d)


def relative_error(x, fit):
    return float(np.linalg.norm(x - fit.G @ fit.F.T) / np.linalg.norm(x))


def min_cosine(a, b):
    """The smallest principal cosine between span(a) and span(b): 1 when they are the same subspace."""
    return float(np.cos(principal_angles(a, b)).min())


# --------------------------------------------------------------------------- converged by default
def test_the_schema_default_cap_is_the_solvers():
    assert GradientSettings().max_iter == MAX_ITER


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_the_default_fit_reaches_the_planted_optimum_and_subspace():
    # the toys' shape (d_model 64, rank 16); fails on the multiplicative updates at 100 or 200 updates (1.14x the
    # noise floor at 200, 2.1x at 100, against 0.86x converged)
    x, f, floor = planted(n=1000, d=64, k=16, noise=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SemiNMFConvergenceWarning)
        fit = semi_nmf(x, 16, seed=0, max_iter=GradientSettings().max_iter)
    assert fit.converged and fit.iterations < GradientSettings().max_iter
    assert fit.error <= 1.05 * floor
    assert min_cosine(fit.F, f) > 0.99
    assert (fit.G >= 0).all()
    assert fit.error == pytest.approx(relative_error(x, fit), rel=1e-9)


def test_the_default_fit_recovers_an_exact_factorisation():
    x, f, _ = planted()
    fit = semi_nmf(x, 5, seed=0)
    assert fit.converged and fit.error < 1e-3
    assert np.degrees(principal_angles(fit.F, f)).max() < 0.5
    assert (fit.G >= 0).all()
    np.testing.assert_allclose(fit.error, relative_error(x, fit))


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_multiplicative_updates_at_the_old_caps_are_not_converged():
    x, _, floor = planted(n=1000, d=64, k=16, noise=0.01)
    converged = semi_nmf(x, 16, seed=0)
    for cap in (100, 200):
        with pytest.warns(SemiNMFConvergenceWarning, match=f"cap of {cap} multiplicative updates"):
            old = semi_nmf(x, 16, seed=0, max_iter=cap, solver="multiplicative")
        assert not old.converged and old.iterations == cap
        assert old.error >= 1.05 * converged.error


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("n, d, seed", [(1024, 64, 0), (512, 64, 1), (1024, 128, 2)])
def test_the_default_fit_of_activation_like_data_converges_within_the_default_cap(n, d, seed):
    x = activation_like(n, d, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SemiNMFConvergenceWarning)
        fit = semi_nmf(x, 16, seed=0)
    assert fit.converged and fit.iterations < MAX_ITER
    assert (fit.G >= 0).all()
    # and the default tolerance means converged: a much tighter fit moves neither the error nor the subspace
    tight = semi_nmf(x, 16, seed=0, tol=1e-9, max_iter=2000)
    assert fit.error <= tight.error * (1 + 1e-3)
    assert min_cosine(fit.F, tight.F) > 0.99


@pytest.mark.slow
def test_the_default_fit_is_as_good_as_the_best_of_long_multiplicative_runs():
    x, f, _ = planted(n=1000, d=64, k=16, noise=0.01)
    fit = semi_nmf(x, 16, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SemiNMFConvergenceWarning)
        best = min(semi_nmf(x, 16, seed=s, max_iter=20000, tol=1e-12, solver="multiplicative").error for s in range(3))
    assert fit.error <= best * 1.001
    assert min_cosine(fit.F, f) > 0.99


# --------------------------------------------------------------------------- the cap
def test_a_fit_stopped_at_the_cap_warns_with_the_fix():
    x = activation_like(512, 32, 3)
    with pytest.warns(SemiNMFConvergenceWarning) as caught:
        fit = semi_nmf(x, 8, seed=0, max_iter=3)
    assert not fit.converged and fit.iterations == 3
    message = str(caught[0].message)
    assert "cap of 3 sweeps" in message
    assert f"relative error {fit.error:.6g}" in message
    assert "last relative change" in message and "raise gradients.max_iter" in message


def test_a_converged_fit_does_not_warn():
    x, _, _ = planted(noise=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SemiNMFConvergenceWarning)
        assert semi_nmf(x, 5, seed=0).converged


# --------------------------------------------------------------------------- properties
@pytest.mark.parametrize("solver", ["als", "multiplicative"])
def test_semi_nmf_is_seeded_and_never_increases_the_error(solver):
    x = np.random.default_rng(3).normal(size=(200, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SemiNMFConvergenceWarning)
        a, b = semi_nmf(x, 4, seed=5, max_iter=30, solver=solver), semi_nmf(x, 4, seed=5, max_iter=30, solver=solver)
        errors = [semi_nmf(x, 4, seed=5, max_iter=i, tol=-1, solver=solver).error for i in (1, 2, 5, 20, 60)]
    np.testing.assert_array_equal(a.F, b.F)
    np.testing.assert_array_equal(a.G, b.G)
    assert (a.error, a.iterations, a.converged) == (b.error, b.iterations, b.converged)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(errors, errors[1:], strict=False))


@pytest.mark.parametrize(
    "x, rank",
    [
        (np.random.default_rng(0).normal(size=(300, 20)), 1),
        (np.random.default_rng(1).normal(size=(50, 8)), 8),  # rank = d
        (np.random.default_rng(2).normal(size=(6, 30)), 6),  # rank = n
        (np.repeat(np.random.default_rng(3).normal(size=(5, 10)), 20, axis=0), 7),  # rank above X's rank
        (np.zeros((20, 6)), 2),
    ],
)
def test_g_is_nonnegative_and_the_error_is_the_reconstruction_error(x, rank):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SemiNMFConvergenceWarning)
        fit = semi_nmf(x, rank, seed=1)
    assert (fit.G >= 0).all() and np.isfinite(fit.F).all()
    assert fit.F.shape == (x.shape[1], rank) and fit.G.shape == (x.shape[0], rank)
    expected = relative_error(x, fit) if np.linalg.norm(x) else 0.0
    assert fit.error == pytest.approx(expected, abs=1e-9)


def test_semi_nmf_rejects_bad_input():
    with pytest.raises(ValueError, match="rank 40"):
        semi_nmf(np.ones((10, 5)), 40)
    with pytest.raises(ValueError, match="NaN"):
        semi_nmf(np.full((10, 5), np.nan), 2)
    with pytest.raises(ValueError, match="solver"):
        semi_nmf(np.ones((10, 5)), 2, solver="newton")
    with pytest.raises(ValueError, match="max_iter"):
        semi_nmf(np.ones((10, 5)), 2, max_iter=0)


# --------------------------------------------------------------------------- the NNLS, against scipy
@pytest.mark.parametrize("case", ["plain", "zero column", "repeated column", "few rows"])
def test_nnls_rows_matches_scipy(case):
    rng = np.random.default_rng(7)
    d, k, n = 40, 8, 300
    f, x = rng.normal(size=(d, k)), rng.normal(size=(n, d)) + rng.normal(size=d)
    if case == "zero column":
        f[:, 3] = 0
    if case == "repeated column":
        f[:, 5] = f[:, 4]
    if case == "few rows":
        x = x[:3]
    reference = np.stack([nnls(f, row)[0] for row in x])
    for start in (None, rng.random((len(x), k)) - 0.5):
        g = nnls_rows(f.T @ f, x @ f, start=start)
        assert (g >= 0).all()
        loss, best = ((x - g @ f.T) ** 2).sum(1), ((x - reference @ f.T) ** 2).sum(1)
        np.testing.assert_allclose(loss, best, rtol=1e-9, atol=1e-9)
        if case == "plain":
            np.testing.assert_allclose(g, reference, atol=1e-8)


def test_nnls_rows_solves_each_row_as_its_own_masked_system():
    """Rows free everywhere share the gram matrix rather than a copy each: the same solutions, bit for bit, as
    building every row's masked system (a fixed coordinate's equation g_j = 0) and solving them all at once."""
    rng = np.random.default_rng(3)
    d, k, n = 20, 6, 200
    f = rng.normal(size=(d, k))
    gram, targets = f.T @ f, rng.normal(size=(n, d)) @ f
    passive = rng.random((n, k)) > 0.1  # about half the rows free everywhere
    assert 0 < passive.all(1).sum() < n
    h = gram + 1e-12 * np.mean(np.diag(gram)) * np.eye(k)
    free = passive.astype(np.float64)
    system = h * free[:, :, None] * free[:, None, :]
    system[:, np.arange(k), np.arange(k)] += 1.0 - free
    built = np.linalg.solve(system, (targets * passive)[..., None])[..., 0]
    whole = passive.all(1)
    for rows in (np.ones(n, bool), whole, ~whole):  # mixed, all free everywhere, none
        np.testing.assert_array_equal(_solve_passive(h, targets[rows], passive[rows]), built[rows])


def test_the_default_solver_takes_the_same_steps_as_scipys_nnls():
    x, _, _ = planted(noise=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SemiNMFConvergenceWarning)
        fast = semi_nmf(x, 5, seed=0, max_iter=40, tol=-1, extrapolate=False)
        reference = semi_nmf_als(x, 5, seed=0, max_iter=40, tol=-1)
    np.testing.assert_allclose(fast.F, reference.F, rtol=1e-6, atol=1e-8)
    assert fast.error == pytest.approx(reference.error, rel=1e-10)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_extrapolation_reaches_the_same_fit_in_fewer_sweeps():
    x = activation_like(1024, 64, 0)
    fast, plain = semi_nmf(x, 16, seed=0), semi_nmf(x, 16, seed=0, extrapolate=False)
    assert fast.converged and plain.converged
    assert fast.iterations < plain.iterations
    assert fast.error <= plain.error * (1 + 1e-4)
    assert min_cosine(fast.F, plain.F) > 0.99
