"""benchmarks/bench_bootstrap.py: its projection on made-up timings, and its --quick mode end to end (tiny shapes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_bootstrap.py"
spec = importlib.util.spec_from_file_location("bench_bootstrap", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def made_up(fixed: float, per: float, extract_s: float) -> dict:
    """Timings as the driver collects them: a step's bootstrap = fixed + per x B, noisy around the median."""
    boot = {
        str(b): [{"seconds": fixed + per * b + noise, "peak_mb": 100.0 + b} for noise in (-0.5, 0.0, 0.5)]
        for b in (2, 4)
    }
    return {
        "shape": {**bench.FULL, "seeds": 5, "steps": 29},
        "bootstrap": boot,
        "extract": [{"seconds": extract_s + noise} for noise in (0.3, 0.0, -0.3)],
    }


def test_the_fit_recovers_the_fixed_cost_and_the_cost_per_replicate():
    fixed, per = bench.fit({2: [11.0, 10.0, 30.0], 4: [14.0, 12.0, 13.0], 8: [99.0]})  # medians 11 and 13
    assert fixed == pytest.approx(9.0) and per == pytest.approx(1.0)


def test_the_projection_of_the_group():
    p = bench.project(made_up(fixed=10.0, per=2.0, extract_s=40.0))
    assert p["step_s_at_target"] == pytest.approx(10.0 + 2.0 * 1000)
    assert p["group_bootstrap_job_s"] == pytest.approx(29 * 2010.0)
    assert p["group_extract_job_s"] == pytest.approx(5 * 29 * 40.0)
    assert p["share_job_s"] == pytest.approx(29 * 2010.0 / (5 * 29 * 40.0))
    assert p["share_core_s"] == pytest.approx(p["share_job_s"] / bench.EXTRACT_THREADS)
    assert p["peak_mb"] == 104.0
    # at B replicates within the goal, the group's bootstrap is 5% of the extracts' core-seconds
    b = p["replicates_within_goal"]
    assert b == pytest.approx(5.0)
    assert 29 * (10.0 + 2.0 * b) == pytest.approx(0.05 * 5 * 29 * 40.0 * bench.EXTRACT_THREADS)
    assert "| bootstrap / extract |" in bench.markdown({**made_up(10.0, 2.0, 40.0), "projection": p})


def test_the_projection_from_cpu_seconds_uses_the_runs_that_measured_them():
    result = made_up(fixed=10.0, per=2.0, extract_s=40.0)
    for rows in (*result["bootstrap"].values(), result["extract"]):
        for row in rows[1:]:  # the first run of each predates the CPU column
            row["cpu_s"] = row["seconds"] / 2
    result = bench.with_projections(result)
    cpu, wall = result["projection_cpu"], result["projection"]
    assert cpu["fixed_s"] == pytest.approx(5.125) and cpu["per_replicate_s"] == pytest.approx(
        1.0
    )  # medians 7.125, 9.125
    assert cpu["extract_s"] == pytest.approx(39.85 / 2) and wall["extract_s"] == pytest.approx(40.0)
    assert "from CPU seconds" in result["markdown"]


@pytest.mark.slow
def test_quick_mode_runs_every_part(tmp_path):
    out = tmp_path / "quick.json"
    bench.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["bootstrap"]) == {"20", "60"} and len(result["extract"]) == 1
    assert all(r["rows"] > 0 for rows in result["bootstrap"].values() for r in rows)
    assert result["extract"][0]["sampled_sites"] == len(bench.sampled_sites(bench.QUICK))  # as the inputs
    p = result["projection"]
    assert set(result["projection_cpu"]) == set(p)
    assert p["step_s_at_target"] > 0 and p["extract_s"] > 0 and p["peak_mb"] > 0
    assert any("eigvalsh" in name for name in result["profile"]["parts"])
    assert out.with_suffix(".md").read_text() == result["markdown"]
