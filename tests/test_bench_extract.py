"""benchmarks/bench_extract.py's verdicts, tables and comparison on made-up results (no GPU): the goal's thresholds,
a skipped CUDA test counted as NOT run, the Markdown's columns; and its comparison and device cell on tiny models
on the CPU."""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

import polars as pl
import pytest
import torch

from anisweep.tables import EXTRACT_TABLES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_extract.py"
spec = importlib.util.spec_from_file_location("bench_extract", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # puts benchmarks/ on sys.path, where its parts are

from bench_extract_parts import compare, device, driver, goal, kernel_tests, models, outliers  # noqa: E402
from bench_extract_parts import speed as speed_part  # noqa: E402
from bench_extract_parts.core import FAIL, NOT_RUN, PASS  # noqa: E402


def cell(shape="bert", batch=32, seq_len=512, dtype="float32", speed=0.9, memory=1.1, hf_speed=0.5):
    """A device-table row as device_cell writes it: plain 1 s a repetition, extract and HF keep-all at the ratios."""
    plain = [1.0, 1.1, 0.9, 1.0, 1.0]
    return {
        "shape": shape,
        "batch": batch,
        "seq_len": seq_len,
        "dtype": dtype,
        "device": "NVIDIA H100 80GB HBM3",
        "attention": "triton",
        "plain": {"seconds": plain, "tokens_per_s": batch * seq_len, "speed_ratio": 1.0, "memory_ratio": 1.0},
        "extract": {"seconds": [s / speed for s in plain], "speed_ratio": speed, "memory_ratio": memory},
        "hf_keep_all": {"seconds": [s / hf_speed for s in plain], "speed_ratio": hf_speed, "memory_ratio": 3.0},
    }


@pytest.mark.parametrize(
    "shape, batch, seq_len, speed, verdict",
    [
        ("bert", 32, 512, 0.79, FAIL),
        ("bert", 32, 512, 0.8, PASS),
        ("pythia", 32, 512, 0.81, PASS),
        ("pythia-1.4b", 8, 512, 0.69, FAIL),
        ("pythia-1.4b", 8, 512, 0.71, PASS),
        ("pythia", 8, 2048, 0.75, PASS),
        ("pythia", 8, 512, 0.75, FAIL),  # outside the goal's table: DEFAULT_GOAL
    ],
)
def test_speed_goal_per_cell(shape, batch, seq_len, speed, verdict):
    checks = device.cell_checks(cell(shape, batch, seq_len, speed=speed))
    assert checks["speed"] == (speed, verdict)
    assert device.cell_verdict(checks) == verdict


@pytest.mark.parametrize(
    "memory, hf_speed, verdict",
    [(1.2, 0.5, PASS), (1.21, 0.5, FAIL), (None, 0.5, NOT_RUN), (1.0, 0.95, FAIL), (None, 0.95, FAIL)],
)
def test_memory_and_hf_goals(memory, hf_speed, verdict):
    """extract at 0.9x: HF keep-all at 0.95x is ahead of it. A memory not measured is NOT RUN, never a pass."""
    row = cell(speed=0.9, memory=memory, hf_speed=hf_speed)
    assert device.cell_verdict(device.cell_checks(row)) == verdict
    assert math.isclose(device.vs_hf(row), 0.9 / hf_speed)


def test_a_cell_that_failed_or_was_not_run():
    base = {"shape": "bert", "batch": 32, "seq_len": 512, "dtype": "float32"}
    assert device.cell_verdict(device.cell_checks({**base, "error": "not run: time budget spent"})) == NOT_RUN
    assert device.cell_verdict(device.cell_checks({**base, "error": "Traceback ...\nOutOfMemoryError: CUDA"})) == FAIL


def columns(line: str) -> int:
    return line.replace("\\|", "").count("|")


def test_device_table_markdown():
    rows = [
        cell(speed=0.81),
        cell("pythia", speed=0.79, memory=1.3),
        {"shape": "pythia-1.4b", "batch": 8, "seq_len": 512, "dtype": "bfloat16", "error": "x | y\nkilled"},
    ]
    lines = device.device_summary(rows)
    assert len(lines) == 2 + len(rows)
    assert {columns(line) for line in lines} == {columns(lines[0])}
    assert lines[2].endswith("| pass |")
    assert (
        "| FAIL (extract / plain 0.790x, goal >= 0.8x; peak memory extract / plain 1.300x, goal <= 1.2x) |" in lines[3]
    )
    assert lines[4].endswith("| FAIL (killed) |")


def junit(*cases: str) -> str:
    return f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'


def case(name: str, inner: str = "", module: str = "tests.extract.test_attention_triton") -> str:
    return f'<testcase classname="{module}" name="{name}">{inner}</testcase>'


CUDA_PASSED = [case("test_compiled_kernels_on_cuda"), case("test_on_a_gpu_no_op_of_a_run_synchronises", "")]
CUDA_SKIPPED = '<skipped type="pytest.skip" message="needs a CUDA device" />'


def kernel_res(xml: str, returncode: int = 0) -> dict:
    return {
        "command": "python -m pytest -q",
        "returncode": returncode,
        **kernel_tests.junit_outcomes(xml),
        "seconds": 1.0,
    }


def test_kernel_tests_pass_only_when_every_test_ran():
    passed = kernel_res(junit(case("test_ties[dtype0]"), *CUDA_PASSED))
    line = kernel_tests.kernel_tests_line(passed)
    assert line["verdict"] == PASS
    assert line["measured"].startswith("3 ran: 3 passed, 0 failed, 0 errors; 0 skipped")

    skipped = kernel_res(junit(case("test_ties[dtype0]"), case("test_compiled_kernels_on_cuda", CUDA_SKIPPED)))
    line = kernel_tests.kernel_tests_line(skipped)
    assert line["verdict"] == NOT_RUN
    assert line["measured"].startswith("1 ran: 1 passed, 0 failed, 0 errors; 1 skipped (NOT run)")
    assert "test_compiled_kernels_on_cuda NOT run" in line["measured"]
    assert "test_on_a_gpu_no_op_of_a_run_synchronises NOT run" in line["measured"]  # missing from the report
    summary = "\n".join(kernel_tests.kernel_tests_summary(skipped))
    assert (
        "skipped, NOT run: tests.extract.test_attention_triton::test_compiled_kernels_on_cuda (needs a CUDA" in summary
    )

    ptxas = '<skipped type="pytest.skip" message="Triton\'s ptxas for sm_90 is missing" />'
    other_skipped = kernel_res(junit(case("test_every_configuration_compiles_without_spills", ptxas), *CUDA_PASSED))
    assert kernel_tests.kernel_tests_line(other_skipped)["verdict"] == NOT_RUN

    failed = kernel_res(junit(case("test_ties[dtype0]", '<failure message="x" />'), *CUDA_PASSED), returncode=1)
    assert kernel_tests.kernel_tests_line(failed)["verdict"] == FAIL
    report = "E   ModuleNotFoundError: No module named 'conftest'"
    failed = kernel_res(junit(case("test_ties[dtype0]", f'<failure message="assert 1 == 0">{report}</failure>')))
    said = failed["failures"]["tests.extract.test_attention_triton::test_ties[dtype0]"]
    assert said == f"assert 1 == 0\n{report}"  # kept from the report, whatever the process printed
    assert f"  {report}" in kernel_tests.kernel_tests_summary(failed)
    assert (
        kernel_tests.kernel_tests_line(
            {"command": "c", "error": "killed at the time budget, after 180 s", **kernel_tests.junit_outcomes(None)}
        )["verdict"]
        == FAIL
    )
    assert kernel_tests.kernel_tests_line(None)["verdict"] == NOT_RUN


def test_table_difference():
    ref = pl.DataFrame(
        {"layer": [0, 1, 2], "site": ["a", "b", "c"], "x": [1.0, -200.0, 1e-4], "v": [[1.0, 2.0], [3.0], []]}
    )
    assert compare.table_difference(ref, ref) == {"max_rel": 0.0, "column": None}
    # relative to the column's largest |ref|, 200: the 1e-3 of x = 1 is 5e-6 of it, the 2e-5 of -200 all of 2e-5
    near = ref.with_columns(pl.Series("x", [1.0 + 1e-3, -200.0 * (1 + 2e-5), 1e-4 + 5e-8]))
    got = compare.table_difference(near, ref)
    assert got["column"] == "x" and math.isclose(got["max_rel"], 2e-5, rel_tol=1e-6)
    small = pl.DataFrame({"y": [1e-4, 2e-3]})  # a column's scale is at least 0.01: below it differences are absolute
    got = compare.table_difference(small.with_columns(pl.col("y") + 1e-9), small)
    assert math.isclose(got["max_rel"], 1e-7, rel_tol=1e-6)
    lists = ref.with_columns(pl.Series("v", [[1.0, 2.0 + 2e-5], [3.0], []]))
    assert compare.table_difference(lists, ref)["column"] == "v"
    inf = float("inf")
    assert compare.table_difference(ref.with_columns(pl.Series("v", [[1.0], [3.0], []])), ref)["max_rel"] == inf
    assert compare.table_difference(ref.with_columns(pl.Series("site", ["a", "b", "d"])), ref)["max_rel"] == inf
    assert compare.table_difference(ref.drop("site"), ref)["max_rel"] == inf
    nan = pl.DataFrame({"x": [float("nan"), 1.0]})
    assert compare.table_difference(nan, nan)["max_rel"] == 0.0
    assert compare.table_difference(nan, pl.DataFrame({"x": [0.0, 1.0]}))["max_rel"] == inf


def sink_keys(*ranked):
    """A sink_keys table of one layer and head: (seq, position, received) listed in this order."""
    return pl.DataFrame(
        [
            {
                "layer": 0,
                "head": 0,
                "rank": r,
                "seq": s,
                "position": p,
                "token_id": p,
                "token": f"t{s}.{p}",
                "kind": "text",
            }
            | {"received": v, "share": v / 4}
            for r, (s, p, v) in enumerate(ranked)
        ]
    )


def test_ranked_tables_compared_item_by_item():
    """Top-k tables are compared item by item, not row by row: a near tie that swaps two ranks, or that swaps the k-th
    item for one of equal value, is the values' difference, not inf; an item listed by one run only differs by its
    value above the other's smallest."""
    ref = sink_keys((0, 0, 40.0), (1, 0, 30.0), (0, 5, 10.0))
    swapped = sink_keys((1, 0, 30.2), (0, 0, 30.1), (0, 5, 10.0))
    got = compare.any_table_difference("sink_keys", swapped, ref)
    assert got["column"] == "received" and math.isclose(got["max_rel"], 9.9 / 40, rel_tol=1e-9)
    assert got["shared"] == 1.0
    assert compare.table_difference(swapped, ref)["max_rel"] == float("inf")  # row by row: the token differs

    replaced = sink_keys((0, 0, 40.0), (1, 0, 30.0), (1, 7, 10.2))  # (0, 5) left the list for a key of about its value
    got = compare.any_table_difference("sink_keys", replaced, ref)
    assert math.isclose(got["max_rel"], 0.2 / 40, rel_tol=1e-9) and math.isclose(got["shared"], 2 / 3)

    far = sink_keys((0, 0, 40.0), (1, 0, 30.0), (1, 7, 25.0))  # listed by one run at 15 above the other's smallest
    assert math.isclose(compare.any_table_difference("sink_keys", far, ref)["max_rel"], 15 / 40, rel_tol=1e-9)
    assert compare.any_table_difference("sink_keys", ref, ref) == {"max_rel": 0.0, "column": None, "shared": 1.0}
    assert compare.any_table_difference("sink_keys", ref.head(2), ref)["max_rel"] == float("inf")
    other_head = ref.with_columns(pl.lit(1, dtype=pl.Int64).alias("head"))
    assert compare.any_table_difference("sink_keys", other_head, ref)["column"] == "(groups)"

    massive = pl.DataFrame(
        {"layer": [0, 0], "site": ["h", "h"], "rank": [0, 1], "seq": [0, 1], "position": [3, 4]}
        | {"token_id": [3, 4], "token": ["a", "b"], "kind": ["text"] * 2, "dim": [7, 9], "value": [50.0, 20.0]}
    )
    other_dim = massive.with_columns(pl.Series("dim", [7, 8]))  # the same token's largest component in another dim
    got = compare.any_table_difference("massive", other_dim, massive)
    assert got == {"max_rel": 0.0, "column": None, "shared": 0.5}


def compare_res(float32_rel=2e-6, attention="triton", fallbacks=()):
    def run(dtype, rel):
        tables = {name: {"max_rel": rel, "column": "c"} for name in ("qk", "attention", "hidden")}
        return {
            "device": "cuda",
            "dtype": dtype,
            "attention": attention,
            "fallbacks": list(fallbacks),
            "judged": dtype == "float32",
            "tables": tables,
        }

    shapes = [{"shape": s, "runs": [run("float32", float32_rel), run("bfloat16", 0.3)]} for s in ("bert", "pythia")]
    return {"device": "cuda", "n_sequences": 8, "seq_len": 512, "rtol": 1e-5, "rel_floor": 0.01, "shapes": shapes}


@pytest.mark.parametrize(
    "res, verdict",
    [
        (compare_res(), PASS),
        (compare_res(float32_rel=1e-5), PASS),
        (compare_res(float32_rel=1.1e-5), FAIL),
        (compare_res(attention="torch"), FAIL),  # the kernel was not what ran
        (compare_res(fallbacks=["FallbackWarning: 512 keys, d_head 64: PTXASError"]), FAIL),
        ({"error": "killed at the time budget, after 120 s"}, FAIL),
        ({"error": "not run: time budget spent"}, NOT_RUN),
        (None, NOT_RUN),
    ],
)
def test_comparison_verdict(res, verdict):
    assert compare.comparison_line(res)["verdict"] == verdict


def test_comparison_markdown_reports_bfloat16_unjudged():
    lines = compare.comparison_summary(compare_res(float32_rel=3e-5))
    rows = [line for line in lines if line.startswith("| bert") or line.startswith("| pythia")]
    assert len(rows) == 4 and {columns(line) for line in rows} == {columns(lines[4])}
    assert rows[0].startswith(
        "| bert-base | cuda float32 | triton | 3.0e-05 | 3.0e-05 | 3.0e-05 | FAIL (qk 3.0e-05 in c"
    )
    assert rows[1].endswith("| reported |")


def goal_out(rows, wall=300.0, res=None):
    tests = kernel_res(junit(case("test_ties[dtype0]"), *CUDA_PASSED))
    call = {"parts": ["tests", "compare", "device"], "device": "cuda", "budget_s": 540, "wall_s": wall}
    return {"device_rows": rows, "comparison": res or compare_res(), "kernel_tests": tests, "call": call}


def test_goal_lines():
    rows = [
        cell("bert", speed=0.85),
        cell("pythia", speed=0.82, dtype="bfloat16"),
        cell("pythia-1.4b", 8, 512, "bfloat16", speed=0.72),
        cell("pythia", 8, 2048, "bfloat16", speed=0.7, hf_speed=0.3),
    ]
    lines = goal.goal_lines(goal_out(rows))
    assert [line["verdict"] for line in lines] == [PASS] * len(lines)
    assert lines[0]["goal"] == "extract >= 0.8x the tokens/s of a plain sdpa forward"
    assert lines[0]["measured"] == "bert-base 32x512 float32 0.85x, pythia-160m 32x512 bfloat16 0.82x"
    assert lines[1]["measured"] == "pythia-1.4b 8x512 bfloat16 0.72x, pythia-160m 8x2048 bfloat16 0.70x"
    assert lines[-1]["measured"] == f"{len(lines) - 1} of {len(lines) - 1} pass"

    rows[1] = cell("pythia", speed=0.79, dtype="bfloat16")
    lines = goal.goal_lines(goal_out(rows, wall=601.0))
    verdicts = {line["goal"]: line["verdict"] for line in lines}
    assert verdicts["extract >= 0.8x the tokens/s of a plain sdpa forward"] == FAIL
    assert verdicts["extract >= 0.7x the tokens/s of a plain sdpa forward"] == PASS
    assert verdicts["one call under 10 minutes"] == FAIL
    assert verdicts["all of the above"] == FAIL

    lines = goal.goal_lines(goal_out([cell(memory=None)]))
    assert lines[-1]["verdict"] == NOT_RUN  # a CPU run: memory not measured, nothing failed

    text = driver.summary({**goal_out(rows), "goal": lines})
    for heading in (
        "### The goal (cuda, budget 540 s)",
        "### The device table",
        "### Device tables",
        "### Kernel tests",
    ):
        assert heading in text


@pytest.mark.parametrize("name", ["extract", "extract_cuda"])
def test_summary_mode_writes_the_stored_markdown_of_its_json(name, capsys):
    """`bench_extract.py summary --out X.json` prints the X.md its run wrote beside it: every part's table, the goal's
    lines, the kernel tests and the comparison, in the format of the stored results."""
    out = SCRIPT.parent / "out" / f"{name}.json"
    bench.main(["summary", "--out", str(out)])
    assert capsys.readouterr().out == out.with_suffix(".md").read_text()


def test_cuda_without_a_gpu_stops_at_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a GPU, and torch sees none"):
        driver.cuda_or_exit("cuda")
    driver.cuda_or_exit("cpu")


def test_comparison_and_device_cell_on_tiny_models():
    """The worker's code paths for real (CPU against CPU: equal), and a device cell's row through the verdicts."""
    args = argparse.Namespace(compare_shapes=["pythia-tiny"], device="cpu", n_sequences=4, seq_len=32, threads=1)
    res = compare.compare(args)
    (run32, run16) = res["shapes"][0]["runs"]
    assert run32["judged"] and not run16["judged"]
    assert set(run32["tables"]) == set(EXTRACT_TABLES)
    assert compare.max_difference(run32) == 0.0 and compare.max_difference(run16) > 0.0
    assert compare.comparison_line(res)["verdict"] == PASS

    args = argparse.Namespace(shape="bert-tiny", batch=2, seq_len=16, dtype="float32", device="cpu", repeat=1)
    row = device.device_cell(args)
    assert row["attention"] == "torch" and row["extract"]["memory_ratio"] is None
    assert device.cell_checks(row)["memory"] == (None, NOT_RUN)
    assert columns(device.device_summary([row])[2]) == columns(device.device_summary([row])[0])


@pytest.mark.slow  # builds and runs a model twice
def test_the_outlier_statistics_are_off_only_in_their_variant():
    """The outlier statistics' cost is extract with them against without: the variant without takes none (no top
    tokens at the sampled sites, no column sums), and extract after it takes them again."""
    runs = models.variants_for("bert-tiny", ["plain", "extract", "extract_without_outliers"])
    batch = models.make_batch("bert-tiny", 2, 16)
    with torch.inference_mode():
        without = runs["extract_without_outliers"](batch)
        with_ = runs["extract"](batch)
    resid = (1, "resid")
    assert not without.vectors[resid].has_outliers and without.sinks[0].n_rows == 0
    assert with_.vectors[resid].has_outliers and with_.sinks[0].n_rows == 2 * 16


def test_the_outlier_cost_pools_the_repetitions_of_every_process(monkeypatch):
    """--processes fresh `speed` processes: each ratio is the median over all their repetitions, not a median of
    medians, each process's own is kept beside it, and the Markdown shows both."""
    plain = [1.0, 1.0, 1.0]
    results = iter(
        [
            {"extract": [1.25, 1.25, 1.25], "extract_without_outliers": [1.1, 1.1, 1.1]},
            {"extract": [1.0, 1.0, 2.0], "extract_without_outliers": [1.0, 1.0, 1.0]},
        ]
    )

    def speed(python, mode, **kw):
        assert mode == "speed" and kw["variants"] == ["plain", "extract", "extract_without_outliers"]
        seconds = {"plain": plain, **next(results)}
        return {
            name: {
                "seconds": s,
                "speed_ratios": [p / x for p, x in zip(plain, s)],
                "speed_ratio": sorted(p / x for p, x in zip(plain, s))[1],
            }
            for name, s in seconds.items()
        }

    monkeypatch.setattr(speed_part, "spawn", speed)
    a = argparse.Namespace(processes=2, repeat=3, threads=2, batch=8)
    cost = outliers.outlier_cost(a, "bert", 512)
    assert cost["with_per_process"] == [0.8, 1.0]
    assert cost["with"] == pytest.approx(0.8)  # of 0.8, 0.8, 0.8, 1, 1, 0.5; the median of medians would be 0.9
    assert cost["without"] == pytest.approx((1 / 1.1 + 1.0) / 2)
    row = driver.summary({"outlier_cost": [cost]}).splitlines()[-1]
    assert row.startswith("| bert | 8x512 | 0.800x | 0.800 / 1.000 | 0.955x |"), row


def test_profile_extract_reports_each_part(tmp_path):
    """benchmarks/profile_extract.py on a tiny model on the CPU: the timing line, the ops by host time and the
    Python functions (the device-time table and the host waits are CUDA's alone)."""
    path = SCRIPT.parent / "profile_extract.py"
    profile_spec = importlib.util.spec_from_file_location("profile_extract", path)
    profile = importlib.util.module_from_spec(profile_spec)
    profile_spec.loader.exec_module(profile)
    profile.main(["--shape", "bert-tiny", "--batch", "2", "--seq-len", "16", "--rows", "5", "--out", str(tmp_path)])
    text = (tmp_path / "bert-tiny_2x16_float32_cpu.txt").read_text()
    assert text.startswith("# bert-tiny_2x16_float32_cpu: plain ")
    assert "## ops by their own host time" in text and "aten::" in text
    assert "## Python functions by cumulative time" in text and "extract/run.py" in text
    assert "device time" not in text and "host waits" not in text
