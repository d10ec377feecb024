"""A user's measures between runs: their code named by content, installed packages that fail named and left out,
the record of stream measures' code, no table or figure left of a removed measure, and a figure that says why
it has nothing to draw."""

from __future__ import annotations

import json
import sys

import numpy as np
import polars as pl
import pytest
from test_registry import write_package

from anisweep.measures import registry
from anisweep.measures.registry import InstalledMeasureError, load, user_measures
from anisweep.measures.stale import code_record, remove_stale_measure_outputs, stale_measure_outputs
from anisweep.plots import measures as plot_measures

CODE = """
from anisweep.measures.registry import table_measure

from {name}.helper import HALF


@table_measure(tables=["hidden"])
def halved(tables):
    '''Half of one.'''
    return [{{"metric": "half", "value": HALF}}]
"""


def forget(name: str) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def package_at(root, name="codepkg", half="0.5"):
    write_package(root, CODE.format(name=name), name=name)
    (root / name / "helper.py").write_text(f"HALF = {half}\n")
    return f"{name}.m:halved"


def identity_at(root, monkeypatch, **kw) -> str:
    forget("codepkg")
    with monkeypatch.context() as m:
        m.syspath_prepend(str(root))
        measure = load(package_at(root, **kw))
        assert str(root) in measure.source_files[0]
        identity = measure.code_identity
    forget("codepkg")
    return identity


def test_a_measures_code_is_its_content_not_its_path(tmp_path, monkeypatch):
    """The same package at two paths (an editable install and a regular one) is one measure; an edit of a module
    it imports makes another."""
    here = identity_at(tmp_path / "editable", monkeypatch)
    assert identity_at(tmp_path / "site-packages", monkeypatch) == here
    assert identity_at(tmp_path / "edited", monkeypatch, half="0.25") != here


def fake_distribution(root, name: str, entry_points: dict[str, str]) -> None:
    """An installed distribution `name` (its dist-info on sys.path) declaring `entry_points` in anisweep.measures."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "\n".join(f"{key} = {value}" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[anisweep.measures]\n{lines}\n")


def test_an_installed_package_that_fails_is_named_and_can_be_left_out(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    fake_distribution(tmp_path, "brokenpkg", {"gone": "brokenpkg_code.nowhere:gone"})
    with pytest.raises(InstalledMeasureError) as caught:
        user_measures([])
    message = str(caught.value)
    assert message.startswith("installed measures: the package 'brokenpkg' declares the measure entry point")
    assert "'gone = brokenpkg_code.nowhere:gone'" in message and "does not import (ModuleNotFoundError" in message
    assert "`installed_measures: {exclude: [brokenpkg]}`" in message
    assert user_measures([], {"exclude": ["brokenpkg"]}) == []
    assert user_measures([], {"exclude": ["gone"]}) == []
    assert user_measures([], {"enabled": False}) == []


def test_an_installed_package_named_in_the_config_is_loaded_once(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = package_at(tmp_path)
    fake_distribution(tmp_path, "codepkg", {"halved": entry})
    try:
        assert [m.entry for m in user_measures([entry])] == [entry]
        assert [m.entry for m in user_measures([], {"exclude": ["CodePkg"]})] == []  # names normalised as pip does
    finally:
        forget("codepkg")


def test_the_code_record_changes_on_an_edit_or_an_addition_never_on_a_removal(tmp_path):
    """code_record says what the file should hold (the rule stream_measure_code writes it); it never writes."""
    path = tmp_path / "resources" / "stream_measure_code.json"
    assert code_record(path, {}) == "" and not path.parent.exists()
    record = code_record(path, {"a": "1", "b": "2"})
    assert json.loads(record) == {"a": "1", "b": "2"} and not path.parent.exists()
    path.parent.mkdir()
    path.write_text(record)
    assert code_record(path, {"a": "1"}) == record  # b removed: the same record, nothing reruns
    assert code_record(path, {}) == record
    assert code_record(path, {"b": "2", "a": "1"}) == record  # the same measures in another order
    assert json.loads(code_record(path, {"a": "3"})) == {"a": "3", "b": "2"}  # a edited
    assert json.loads(code_record(path, {"c": "4"})) == {"a": "1", "b": "2", "c": "4"}  # c added
    assert path.read_text() == record
    path.write_text("{damaged")
    assert json.loads(code_record(path, {"a": "3"})) == {"a": "3"}
    assert code_record(path, {}) == "{}"  # a damaged file is written again, even with no stream measure


def test_a_removed_measure_leaves_no_table_or_figure(tmp_path, capsys):
    model = tmp_path / "results" / "toy" / "toy-neox"
    kept = [model / "step0" / "measures" / "kept.parquet", model / "figures" / "measure_kept.png"]
    gone = [model / f"step{s}" / "measures" / "gone.parquet" for s in (0, 8)] + [model / "figures" / "measure_gone.png"]
    other_model = tmp_path / "results" / "toy" / "toy-bert" / "figures" / "measure_gone.png"
    for path in [*kept, *gone, other_model, model / "figures" / "isotropy.png"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    models = [("toy", "toy-neox")]
    assert stale_measure_outputs(tmp_path / "results", models, ["kept"]) == sorted(gone)
    remove_stale_measure_outputs(tmp_path / "results", models, ["kept"])
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept) and other_model.exists()
    assert "removed 3 tables and figures of measures no longer in the config: gone" in capsys.readouterr().out


def sweep_of(values) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "measure": ["mine"] * len(values),
            "metric": ["m"] * len(values),
            "value": values,
            "status": ["ok" if np.isfinite(v) else "nan" for v in values],
            "step": list(range(len(values))),
        }
    )


def test_a_measure_whose_rows_are_all_nan_says_so_in_its_figure(tmp_path, monkeypatch):
    said = {}
    monkeypatch.setattr(plot_measures, "not_measured", lambda sweep, path, what, why: said.update(what=what, why=why))
    measure = registry.Measure("mine", "table", lambda t: None, tables=("hidden",), entry="x:mine")
    plot_measures.plot_measure(measure, sweep_of([float("nan"), float("inf")]), tmp_path / "m.png")
    why = "every one of its 2 rows is NaN or inf\n(status nan in sweep.parquet)"
    assert said == {"what": "measure mine", "why": why}
    plot_measures.plot_measure(measure, sweep_of([]).cast({"value": pl.Float64}), tmp_path / "m.png")
    assert said["why"] == "not in this sweep's metrics"


def test_the_installed_measures_key_has_its_defaults():
    from anisweep import config

    completed = config.complete({"models": [{"family": "toy", "name": "toy-bert", "steps": [0]}]})
    assert completed["installed_measures"] == {"enabled": True, "exclude": []}
    models = [{"family": "toy", "name": "toy-bert", "steps": [0]}]
    with pytest.raises(Exception, match="installed_measures"):
        config.complete({"models": models, "installed_measures": {"x": 1}})
