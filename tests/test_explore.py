"""The explorer page (anisweep.explore.data): the per-layer rows of the analysed steps, each value the sweep's at
float32, nothing per head or per token; Plotly inline and no address to fetch; thinned evenly past its size limit;
`anisweep explore results/` writes it."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from explore_sweeps import (
    HOSTILE,
    MODELS,
    STEPS,
    expected,
    expected_intervals,
    write_gaps,
    write_hostile,
    write_intervals,
    write_results,
)

from anisweep.cli import main
from anisweep.explore.data import drawn_rows, explore_data, scan_sweeps, write_explore
from anisweep.explore.page import plotly_js

#: The page data the explorer wrote when it read every sweep row into memory at once, on the sweeps of CASES.
BEFORE = Path(__file__).with_name("explore_pages.json")


@pytest.fixture
def results(tmp_path):
    write_results(tmp_path / "results")
    return tmp_path / "results"


def _decoded(data: dict) -> dict:
    values = np.frombuffer(base64.b64decode(data["values"]), dtype="<f4")
    s, out, at = data["series"], {}, 0
    for k, site, metric, layer in zip(s["model"], s["site"], s["metric"], s["layer"], strict=True):
        model = data["models"][k]
        n = len(model["steps"])
        key = (model["family"], model["model"], model["seed"], data["sites"][site], data["metrics"][metric], layer)
        out[key] = (model["steps"], model["tokens"], values[at : at + n])
        at += n
    assert at == values.size
    return out


def test_every_series_is_the_sweeps_per_layer_values_at_float32(results):
    series = _decoded(explore_data(scan_sweeps([results])))
    wanted = {
        (f, m, s, site, metric, layer)
        for (f, m, s), n in MODELS.items()
        for site, metric, layers in (
            ("resid", "avg_cos", n + 1),
            ("resid", "isoscore", n + 1),
            ("attention", "entropy_mean", n),
        )
        for layer in range(layers)
    }
    assert set(series) == wanted  # no head's row, no subspace's, no whole-model (layer null) row
    for key, (steps, tokens, values) in series.items():
        rows = expected(results, key[0], key[1], key[2], *key[3:])
        assert steps == rows["step"].to_list() and tokens == rows["tokens_seen"].to_list()
        assert np.array_equal(values, rows["value"].to_numpy().astype(np.float32))
    assert 8 not in series[("pythia", "pythia-70m", 0, "resid", "avg_cos", 0)][0]  # its duplicate step
    assert series[("toy", "toy-neox", 1, "resid", "avg_cos", 0)][0] == STEPS


def test_past_its_limit_each_model_keeps_evenly_spaced_steps_its_first_and_last(results):
    sweeps = scan_sweeps([results])
    full = explore_data(sweeps)
    small = explore_data(sweeps, max_values=len(base64.b64decode(full["values"])) // 4 // 2)
    for model in small["models"]:  # half the values: 5 (or 4) steps -> 2, the first and the last
        assert model["all_steps"] == (4 if model["model"] == "pythia-70m" else 5)
        assert model["steps"] == [0, 512]
    values = _decoded(small)
    for key, (steps, _, got) in values.items():
        rows = expected(results, *key).filter(pl.col("step").is_in(steps))
        assert np.array_equal(got, rows["value"].to_numpy().astype(np.float32))


def test_the_page_is_self_contained(results, tmp_path):
    page = write_explore(scan_sweeps([results]), tmp_path / "explore.html").read_text()
    assert plotly_js().startswith("/**\n* plotly.js (basic - minified) v")
    assert page.count(plotly_js()) == 1  # plotly.js itself, inline
    own = page.replace(plotly_js(), "")
    assert "Plotly.react" in own and not re.search(r"""(src|href)=["']?(https?:)?//|<script src|<link""", own)
    assert page.count('id="anisweep-data"') == 1


def test_no_name_can_end_the_data_element_or_change_how_it_is_read(tmp_path):
    root = tmp_path / "results<!--<script>"
    write_hostile(root)
    sweeps = scan_sweeps([root])
    page = write_explore(sweeps, root / "explore.html").read_text()
    start = page.index('<script type="application/json" id="anisweep-data">') + len(
        '<script type="application/json" id="anisweep-data">'
    )
    text = page[start : page.lower().index("</script", start)]
    assert (
        "<" not in text and ">" not in text
    )  # no `</script`, `<!--` or `<script` in it: the tokenizer stays in script data
    data = json.loads(text)
    assert data == explore_data(sweeps)
    assert (data["models"][0]["family"], data["models"][0]["model"]) == (HOSTILE["family"], HOSTILE["model"])
    assert HOSTILE["site"] in data["sites"] and HOSTILE["metric"] in data["metrics"]


def test_anisweep_explore_writes_the_page_into_the_results_folder(results, capsys):
    assert main(["explore", str(results)]) == 0
    assert (results / "explore.html").is_file()
    assert str(results / "explore.html") in capsys.readouterr().out


def _decoded_intervals(data: dict) -> dict:
    """{(model, seed, site, metric, layer): (low, high, band words)} of the page data's intervals."""
    found = data["intervals"]
    low, high = (np.frombuffer(base64.b64decode(found[end]), dtype="<f4") for end in ("low", "high"))
    s, out, at = data["series"], {}, 0
    for i, label in zip(found["series"], found["label"], strict=True):
        model = data["models"][s["model"][i]]
        n = len(model["steps"])
        site, metric = data["sites"][s["site"][i]], data["metrics"][s["metric"][i]]
        key = (model["model"], model["seed"], site, metric, s["layer"][i])
        out[key] = (low[at : at + n], high[at : at + n], found["labels"][label])
        at += n
    assert at == low.size == high.size
    return out


def test_the_bootstrap_tables_intervals_lie_beside_their_series_at_float32(results):
    from anisweep.plots.intervals import read_intervals

    data = explore_data(scan_sweeps([results]), intervals=read_intervals(write_intervals(results)))
    intervals = _decoded_intervals(data)
    assert set(intervals) == {("pythia-70m", 0, "resid", "isoscore", layer) for layer in range(4)}
    for (_, _, _, _, layer), (low, high, words) in intervals.items():
        want = expected_intervals(results, layer)
        (pythia,) = [m for m in data["models"] if m["model"] == "pythia-70m"]
        assert want["step"].to_list() == pythia["steps"] == [0, 1, 64, 512]
        for got, end in ((low, "low"), (high, "high")):
            wanted = want[end].fill_null(float("nan")).to_numpy().astype(np.float32)
            assert np.array_equal(got, wanted, equal_nan=True)
        assert np.isnan(low[2]) and np.isnan(low).any() is not False
        assert words == "90% interval, Multi-Bootstrap over sequences"
    assert "intervals" not in explore_data(scan_sweeps([results]))  # the page of sweeps alone, as before


def _page_data(path: Path) -> dict:
    text = path.read_text()
    start = text.index('id="anisweep-data">') + len('id="anisweep-data">')
    return json.loads(text[start : text.index("</script>", start)])


def test_anisweep_explore_finds_the_bootstrap_tables_beside_the_sweeps_unless_told_which(results, capsys):
    write_intervals(results)
    assert main(["explore", str(results)]) == 0
    assert len(_page_data(results / "explore.html")["intervals"]["series"]) == 4
    sweeps = sorted(map(str, results.glob("*/*/sweep.parquet")))
    assert main(["explore", "--out", str(results / "none.html"), "--bootstrap", "--", *sweeps]) == 0
    assert "intervals" not in _page_data(results / "none.html")


def _truncated(path):
    path.write_bytes(path.read_bytes()[:-100])
    return path


BAD_INPUT = {  # source (under a results folder's parent): what the one line says
    "a missing folder": (
        lambda results: results / "nowhere",
        "neither a results folder nor a sweep.parquet file: run the sweep first",
    ),
    "an empty folder": (
        lambda results: results / "toy",  # a family's folder: no {family}/{model}/sweep.parquet under it
        "no sweep.parquet under",
    ),
    "a folder with a truncated sweep.parquet": (
        lambda results: _truncated(results / "toy" / "toy-neox" / "sweep.parquet").parents[2],
        "toy-neox/sweep.parquet is not a whole Parquet file",
    ),
    "a truncated sweep.parquet": (
        lambda results: _truncated(results / "toy" / "toy-neox" / "sweep.parquet"),
        "toy-neox/sweep.parquet is not a whole Parquet file",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_prints_its_message_alone_and_the_traceback_only_when_asked(results, capsys, case):
    source, message = BAD_INPUT[case]
    source = str(source(results))
    with pytest.raises(SystemExit) as exit_:
        main(["explore", source])
    assert exit_.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line and line.startswith(("FileNotFoundError: explore: ", "DamagedTable: "))
    assert main(["explore", "--traceback", source]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.splitlines()[-1] == line


def test_sweeps_without_an_analysed_row_are_an_error_that_says_so(results):
    sweeps = scan_sweeps([results]).with_columns(status=pl.lit("duplicate"))
    with pytest.raises(ValueError, match=r"no analysed per-layer row \(status ok\)"):
        explore_data(sweeps)


def _cases(tmp: Path) -> dict:
    """(sources, max_values) of each case of BEFORE."""
    write_results(tmp / "results")
    write_gaps(tmp / "gaps")
    write_hostile(tmp / "hostile")
    neox = tmp / "results" / "toy" / "toy-neox" / "sweep.parquet"
    return {
        "results": ([tmp / "results"], None),
        "results, half the values": ([tmp / "results"], 90),
        "gaps": ([tmp / "gaps"], None),
        "gaps, a third of the values": ([tmp / "gaps"], 60),
        "hostile": ([tmp / "hostile"], None),
        "a folder and one of its files": ([tmp / "results", neox], None),
        "a folder and one of its files, thinned": ([tmp / "results", neox], 100),
        "two files": ([neox, tmp / "gaps" / "hub" / "tiny-hub" / "sweep.parquet"], None),
    }


def test_the_page_data_is_what_reading_every_row_at_once_gave(tmp_path):
    before = json.loads(BEFORE.read_text())
    cases = _cases(tmp_path)
    assert set(cases) == set(before)
    for name, (sources, limit) in cases.items():
        data = explore_data(scan_sweeps(sources), **({} if limit is None else {"max_values": limit}))
        assert data == before[name], name


@pytest.mark.parametrize("limit", [None, 60])
def test_each_read_is_one_models_drawn_rows_with_the_filter_in_the_parquet_scan(tmp_path, monkeypatch, limit):
    """What the explorer collects, thinned or not: never a row it does not draw, never two models' rows at once."""
    write_gaps(tmp_path)
    for path in tmp_path.glob("*/*/sweep.parquet"):  # a column the page does not draw
        pl.read_parquet(path).with_columns(measure=pl.lit("isotropy")).write_parquet(path)
    sweeps = scan_sweeps([tmp_path])
    per_model = drawn_rows(sweeps).collect().group_by("family", "model").len()["len"]
    collect, reads = pl.LazyFrame.collect, []

    def recorded(self, *args, **kwargs):
        frame = collect(self, *args, **kwargs)
        reads.append((self.explain(), frame.height))
        return frame

    monkeypatch.setattr(pl.LazyFrame, "collect", recorded)
    explore_data(sweeps, **({} if limit is None else {"max_values": limit}))
    scans = [(plan, height) for plan, height in reads if "Parquet SCAN" in plan]
    assert len(scans) == 1 + per_model.len() * (1 if limit is None else 2)  # the models' names, then each model
    for plan, height in scans:
        assert 'col("head").is_null()' in plan and 'col("status") == "ok"' in plan  # pushed into the scan
        scan = plan.split("Parquet SCAN")[1]
        projected, columns = map(int, re.search(r"PROJECT (\d+)/(\d+) COLUMNS", scan).groups())
        assert "SELECTION" in scan and projected < columns  # the filter and the columns it needs, in the scan
        assert height <= per_model.max()


@pytest.mark.slow  # 4.8 million sweep rows written and read: seconds
def test_peak_memory_holds_one_models_drawn_rows_not_every_sweep_row(tmp_path):
    """A fresh process's peak memory over 8 models of 600,000 rows, a sixth of them drawn (the rest a head's): read
    at once, every row costs some 300 bytes (1.4 GB); read lazily, one model's drawn rows and the page's values."""
    rng = np.random.default_rng(0)
    layout = pl.DataFrame({"layer": range(20)}).join(
        pl.DataFrame({"metric": [f"m{i}" for i in range(10)]}), how="cross"
    )
    layout = layout.join(pl.DataFrame({"head": [None, *range(5)]}, schema={"head": pl.Int64}), how="cross")
    steps = pl.DataFrame({"step": range(500)})
    for m in range(8):
        sweep = steps.join(layout, how="cross").with_columns(
            family=pl.lit("pythia"),
            model=pl.lit(f"m{m}"),
            seed=pl.lit(None, pl.Int64),
            tokens_seen=pl.col("step") * 2,
            site=pl.lit("resid"),
            value=pl.Series(rng.random(steps.height * layout.height)),
            status=pl.lit("ok"),
        )
        path = tmp_path / "results" / "pythia" / f"m{m}" / "sweep.parquet"
        path.parent.mkdir(parents=True)
        sweep.write_parquet(path)
    assert sweep.height == 600_000 and sweep["head"].null_count() == 100_000

    def peak_mb(*arguments: str) -> float:  # through a small process: a child of pytest starts with its pages
        runner = (
            "import os, subprocess, sys; child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "_, status, usage = os.wait4(child.pid, 0); print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)"
        )
        done = subprocess.run(
            [sys.executable, "-c", runner, sys.executable, *arguments], capture_output=True, text=True
        )
        code, peak_kb = map(int, done.stdout.split())
        assert code == 0, done.stderr
        return peak_kb / 1024

    baseline = peak_mb("-c", "import polars, numpy, anisweep.explore.data, anisweep.cli")
    explore = peak_mb("-m", "anisweep", "explore", str(tmp_path / "results"))
    assert explore - baseline < 400, (explore, baseline)
