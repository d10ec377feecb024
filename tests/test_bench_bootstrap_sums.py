"""benchmarks/bench_bootstrap_sums.py runs: its quick mode on a tiny shape, every part of the real one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_bootstrap_sums


def test_the_quick_mode_measures_a_step_and_projects_the_group():
    out = bench_bootstrap_sums.main(["--quick", "--repeat", "1"])
    assert out["extract_cpu_s"] > 0 and len(out["bootstrap_step_cpu_s"]) == 1
    assert out["share"] == pytest.approx(out["group_bootstrap_cpu_s"] / out["group_extract_cpu_s"])
    assert out["rows_per_step"] > 0
    assert out["cka_step_cpu_s"] > 0 and out["cka_share"] == pytest.approx(
        out["cka_step_cpu_s"] / (out["extract_cpu_s"] * bench_bootstrap_sums.SEEDS)
    )
