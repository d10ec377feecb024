"""The spectra figure over training, and its isotropic baseline against Gaussian samples."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from anisweep.measures.spectra import SCHEMA, _rows
from anisweep.plots.spectra import SPECTRA_FIGURES, chosen_steps, hidden_panels, isotropic_shares, spectra_figure

SLOW = pytest.mark.slow  # over ~1 s: the quick subset leaves these sizes to the full run


@pytest.mark.parametrize(
    "n, d", [pytest.param(1024, 64, marks=SLOW), pytest.param(300, 100, marks=SLOW), (64, 200), (128, 128)]
)
def test_isotropic_baseline_is_the_spectrum_of_gaussian_samples(n, d):
    """Marchenko-Pastur quantiles against the mean normalised spectrum of seeded N(0, I) samples of that shape."""
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(40):
        singular = np.linalg.svd(rng.standard_normal((n, d)), compute_uv=False)
        draws.append(singular / singular.sum())
    sampled = np.mean(draws, axis=0)
    baseline = isotropic_shares(n, d)
    assert baseline.shape == sampled.shape == (min(n, d),)
    assert baseline.sum() == pytest.approx(1.0)
    assert np.all(np.diff(baseline) <= 0)
    # the interior within 2% (1/min(n, d) finite-size effects); the edges carry a Tracy-Widom shift, a few %
    # n = d: the smallest values sit at the law's hard edge 0, where 1/n effects are large; left to the next test
    inner = slice(2, -2) if n != d else slice(2, -d // 8)
    np.testing.assert_allclose(baseline[inner], sampled[inner], rtol=0.02)
    np.testing.assert_allclose(baseline, sampled, rtol=0.06 if n != d else 0.5)


def test_isotropic_baseline_in_the_square_case_is_the_quarter_circle():
    """n = d: the squared singular values / n follow the Marchenko-Pastur law with ratio 1, whose singular values
    s = sqrt(x) have the quarter-circle density sqrt(4 - s^2) / pi on [0, 2]: its quantiles by hand."""
    d = 400
    s = np.linspace(0, 2, 200_001)
    cdf = (s * np.sqrt(4 - s**2) / 2 + 2 * np.arcsin(s / 2)) / np.pi  # the integral of sqrt(4 - s^2) / pi
    expected = np.interp(1 - (np.arange(d) + 0.5) / d, cdf, s)
    np.testing.assert_allclose(isotropic_shares(d, d), expected / expected.sum(), rtol=1e-4)


def test_chosen_steps_spread_in_log_step():
    assert chosen_steps([0, 1, 2]) == [0, 1, 2]
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    chosen = chosen_steps(steps)
    assert chosen[0] == 0 and chosen[-1] == 1000 and len(chosen) == 6 and set(chosen) <= set(steps)


def _synthetic(steps=(0, 1, 10, 100, 1000), d=16, d_head=4, n=120, n_layers=3, heads=2) -> pl.DataFrame:
    """spectra.parquet rows of a model whose hidden states drift along one direction as steps grow."""
    rng = np.random.default_rng(1)
    tables = []
    for step in steps:
        rows = []
        drift = np.log1p(step)
        for layer in range(n_layers + 1):
            sites = ["resid"] + (["final_ln_in", "final_ln_out"] if layer == n_layers else [])
            for site in sites:
                rows += _rows(layer, None, site, "hidden", rng.standard_normal((n, d)) + drift * np.eye(d)[0])
        for layer in range(n_layers):
            for head in range(heads):
                for which in ("q", "k"):
                    rows += _rows(layer, head, "qk_post", which, rng.standard_normal((n, d_head)) + drift)
        ident = {"family": "toy", "model": "synthetic", "seed": 0, "step": step, "tokens_seen": step * 100}
        tables.append(pl.DataFrame(rows, schema=SCHEMA).with_columns(**{k: pl.lit(v) for k, v in ident.items()}))
    return pl.concat(tables)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_spectra_figure_is_written_from_a_synthetic_table(tmp_path):
    spectra = _synthetic()
    assert [p[:2] for p in hidden_panels(spectra)] == [
        (0, "resid"),
        (2, "resid"),
        (3, "final_ln_in"),
        (3, "final_ln_out"),
    ]
    path = tmp_path / "spectra.png"
    spectra_figure(spectra, path)
    assert path.stat().st_size > 20_000
    no_final = spectra.filter(~pl.col("site").str.starts_with("final_ln"))
    assert [p[:2] for p in hidden_panels(no_final)] == [(0, "resid"), (2, "resid"), (3, "resid")]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_cli_plot_spectra(tmp_path):
    spectra = _synthetic(steps=(0, 5))
    paths = []
    for step, part in spectra.group_by("step"):
        paths.append(tmp_path / f"step{step[0]}.parquet")
        part.write_parquet(paths[-1])
    out = tmp_path / SPECTRA_FIGURES[0]
    cmd = [sys.executable, "-m", "anisweep", "plot-spectra", "--out", str(out), *map(str, paths)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 20_000


def test_last_singular_value_after_a_layernorm_is_zero_only_while_its_bias_is():
    """spectra.rst: after a LayerNorm (gain g, bias b) every vector's component along w = (1/g)/||1/g|| is
    <b, w>, so the last singular value is ~0 with b = 0 and lifted, to at most sqrt(n)|<b, w>|, by a bias."""
    import torch

    from anisweep.measures.spectra import spectrum

    rng = np.random.default_rng(0)
    n, d = 512, 32
    x = torch.tensor(rng.normal(size=(n, d)) + 3 * rng.normal(size=d), dtype=torch.float32)
    gain = torch.tensor(1 + 0.3 * rng.normal(size=d), dtype=torch.float32)
    w = (1 / gain.double()) / torch.linalg.vector_norm(1 / gain.double())
    for bias, zero in ((torch.zeros(d), True), (torch.tensor(0.1 * rng.normal(size=d), dtype=torch.float32), False)):
        y = torch.nn.functional.layer_norm(x, (d,), gain, bias).numpy()
        singular, _ = spectrum(y)
        offset = math.sqrt(n) * abs(float(bias.double() @ w))
        assert np.ptp(y.astype(np.float64) @ w.numpy()) < 1e-5  # one component shared by every vector
        if zero:
            assert singular[-1] / singular[-2] < 1e-5
        else:
            assert 1e-3 < singular[-1] / singular[-2] and singular[-1] <= offset * (1 + 1e-6)
