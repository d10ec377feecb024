"""anisweep.results over the Multi-Bootstrap's tables: scan(root, "bootstrap") reads every model's bootstrap.parquet,
every group's and every comparison's table with their identity columns, and changes() picks exactly the step tests
whose interval of the difference leaves out 0, on a results folder written here with known values."""

from __future__ import annotations

import polars as pl
import pytest

from anisweep.measures import group_bootstrap, sample_bootstrap
from anisweep.results import changes, changes_in, scan, tables

#: (layer, metric, step, against, ref_step, low, high) of each test row, and whether changes() must list it
TESTS = [
    (0, "isoscore", 8, "previous", 0, 0.01, 0.2, True),  # a rise
    (0, "isoscore", 32, "previous", 8, -0.3, -0.02, True),  # a fall
    (1, "isoscore", 8, "previous", 0, -0.1, 0.2, False),  # the interval holds 0
    (1, "isoscore", 32, "previous", 8, 0.0, 0.4, False),  # touches 0: not beyond it
    (0, "rankme", 8, "previous", 0, float("nan"), float("nan"), False),  # undefined
    (0, "rankme", 32, "previous", 8, -2.0, -1.0, True),
    (0, "isoscore", 0, "final", 32, 0.1, 0.3, False),  # a test against the final step: not a change
]


def bootstrap_rows(group: str | None, model: str | None, seed: int | None, shift: float) -> pl.DataFrame:
    """One table as bootstrap_table writes it: an interval per (layer, metric, step), and the step tests above,
    each test's bounds moved by `shift` (0 for the model whose rows are listed as TESTS says)."""
    common = {"group": group, "models": ["toy/a"] if group is None else ["toy/a", "toy/b"], "family": "toy"}
    common |= {"model": model, "seed": seed, "site": "resid", "level": 0.95, "n_units": 8, "samples": 100}
    common |= {"n_seeds": 1 if group is None else 2, "undefined": 0}
    rows = [
        common
        | {"step": step, "tokens_seen": step * 10, "layer": layer, "metric": metric, "against": None, "ref_step": None}
        | {"estimate": 0.5, "low": 0.4, "high": 0.6, "p": None, "design": "units"}
        for layer in (0, 1)
        for metric in ("isoscore", "rankme")
        for step in (0, 8, 32)
    ]
    for layer, metric, step, against, ref_step, low, high, _ in TESTS:
        rows.append(
            common
            | {"step": step, "tokens_seen": step * 10, "layer": layer, "metric": metric}
            | {"against": against, "ref_step": ref_step, "design": "paired"}
            | {"estimate": (low + high) / 2 + shift, "low": low + shift, "high": high + shift, "p": 0.01}
        )
    return pl.DataFrame(rows, schema=sample_bootstrap.SCHEMA)


@pytest.fixture
def results(tmp_path):
    return write_results(tmp_path / "results")


def write_results(root):
    """toy/a and toy/b with their bootstrap.parquet (b's tests all shifted far above 0: every one a change), a group
    "ab" with a's rows, a comparison "ab-ba", and what scan must not take for a model (the compare folder)."""
    for model, seed, shift in (("a", 0, 0.0), ("b", 1, 10.0)):
        (root / "toy" / model / "step0").mkdir(parents=True)
        bootstrap_rows(None, model, seed, shift).write_parquet(root / "toy" / model / "bootstrap.parquet")
    (root / "bootstrap" / "compare").mkdir(parents=True)
    bootstrap_rows("ab", None, None, 0.0).write_parquet(root / "bootstrap" / "ab.parquet")
    comparison = {
        "comparison": "ab-ba", "base_group": "ab", "other_group": "ba", "base_models": ["toy/a", "toy/b"],
        "other_models": ["toy/b", "toy/a"], "family": "toy", "model": None, "seed": None, "step": 8,
        "tokens_seen": 80, "other_tokens_seen": 80, "layer": 0, "site": "resid", "metric": "isoscore",
        "against": "group", "estimate": 0.3, "base_estimate": 0.2, "other_estimate": 0.5, "low": 0.1, "high": 0.4,
        "p": 0.002, "level": 0.95, "n_seeds_base": 2, "n_seeds_other": 2, "n_units": 8, "samples": 100,
        "undefined": 0, "design": "paired",
    }  # fmt: skip
    pl.DataFrame([comparison], schema=group_bootstrap.SCHEMA).write_parquet(root / "bootstrap/compare/ab-ba.parquet")
    (root / "bootstrap" / "compare" / ".ab-ba.parquet.tmp").write_bytes(b"")  # an atomic write under way
    return root


def test_scan_reads_the_models_the_groups_and_the_comparisons_tables(results):
    assert tables(results) == ["bootstrap"]  # no family "bootstrap", no model "compare"
    rows = scan(results, "bootstrap").collect()
    assert rows.columns[:5] == ["family", "model", "seed", "step", "tokens_seen"]
    per_table = len(TESTS) + 12
    assert rows.height == 3 * per_table + 1
    models = rows.filter(pl.col("group").is_null() & pl.col("comparison").is_null())
    assert models.group_by("model", "seed").len().sort("model").rows() == [("a", 0, per_table), ("b", 1, per_table)]
    group = rows.filter(pl.col("group") == "ab")
    assert group.height == per_table and group["model"].null_count() == group["seed"].null_count() == per_table
    compared = rows.filter(pl.col("comparison") == "ab-ba")
    assert compared.select("family", "model", "step", "tokens_seen", "against", "design").rows() == [
        ("toy", None, 8, 80, "group", "paired")
    ]
    assert compared["base_models"][0].to_list() == ["toy/a", "toy/b"]
    # rows by family, model and step: the models' tables first, then the group's, then the comparison's
    assert rows["model"][: 2 * per_table].to_list() == ["a"] * per_table + ["b"] * per_table
    assert rows["comparison"][-1] == "ab-ba"


def test_changes_are_exactly_the_previous_step_tests_beyond_their_interval(results):
    found = changes(results)
    listed = [t for t in TESTS if t[-1]]
    expected = sorted(
        [("a", None, layer, metric, step) for layer, metric, step, *_ in listed]
        + [("b", None, t[0], t[1], t[2]) for t in TESTS if t[3] == "previous" and t[5] == t[5]]  # NaN: never
        + [(None, "ab", layer, metric, step) for layer, metric, step, *_ in listed],
        key=lambda r: (r[0] or "", r[1] or "", r[3], r[2], r[4]),
    )
    got = found.select("model", "group", "layer", "metric", "step").rows()
    assert sorted(got, key=lambda r: (r[0] or "", r[1] or "", r[3], r[2], r[4])) == expected
    # b's NaN test stays out even shifted; its test whose interval held 0 is now beyond it
    assert ("b", None, 0, "rankme", 8) not in got
    model_a = found.filter(pl.col("model") == "a").sort("metric", "layer", "step")
    assert model_a.select("ref_step", "difference", "low", "high", "p", "direction").rows() == [
        (0, pytest.approx(0.105), 0.01, 0.2, 0.01, "rise"),
        (8, pytest.approx(-0.16), -0.3, -0.02, 0.01, "fall"),
        (8, -1.5, -2.0, -1.0, 0.01, "fall"),
    ]
    assert set(found["against"]) == {"previous"} and "comparison" not in found.columns
    assert found.columns[:5] == ["family", "model", "seed", "step", "tokens_seen"]
    assert found.filter(pl.col("group") == "ab")["models"][0].to_list() == ["toy/a", "toy/b"]


def test_changes_against_the_final_step_and_bad_input(results):
    final = changes(results, against="final")
    assert sorted(set(final.select("model", "group").rows()), key=str) == sorted(
        [("a", None), ("b", None), (None, "ab")], key=str
    )
    assert set(final["step"]) == {0} and set(final["ref_step"]) == {32}
    with pytest.raises(ValueError, match="against 'last'"):
        changes(results, against="last")
    with pytest.raises(ValueError, match="not a bootstrap table"):
        changes_in(pl.DataFrame({"metric": ["isoscore"], "value": [0.5]}))
    empty = results.parent / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no bootstrap.parquet under results root"):
        changes(empty)
