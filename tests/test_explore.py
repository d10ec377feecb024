"""The explorer page (anisweep.explore.data): the per-layer rows of the analysed steps, each value the sweep's at
float32, nothing per head or per token; Plotly inline and no address to fetch; thinned evenly past its size limit;
`anisweep explore results/` writes it."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import polars as pl
import pytest
from explore_sweeps import HOSTILE, MODELS, STEPS, expected, write_hostile, write_results

from anisweep.cli import main
from anisweep.explore.data import explore_data, read_sweeps, write_explore
from anisweep.explore.page import plotly_js


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
    series = _decoded(explore_data(read_sweeps([results])))
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
    sweeps = read_sweeps([results])
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
    page = write_explore(read_sweeps([results]), tmp_path / "explore.html").read_text()
    assert plotly_js().startswith("/**\n* plotly.js (basic - minified) v")
    assert page.count(plotly_js()) == 1  # plotly.js itself, inline
    own = page.replace(plotly_js(), "")
    assert "Plotly.react" in own and not re.search(r"""(src|href)=["']?(https?:)?//|<script src|<link""", own)
    assert page.count('id="anisweep-data"') == 1


def test_no_name_can_end_the_data_element_or_change_how_it_is_read(tmp_path):
    root = tmp_path / "results<!--<script>"
    write_hostile(root)
    sweeps = read_sweeps([root])
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
    sweeps = read_sweeps([results]).with_columns(status=pl.lit("duplicate"))
    with pytest.raises(ValueError, match=r"no analysed per-layer row \(status ok\)"):
        explore_data(sweeps)
