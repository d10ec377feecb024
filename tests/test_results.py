"""anisweep.results: scan() and tables() over synthetic results folders, checked against frames built by hand."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from anisweep.results import scan, tables

MODELS = {"toy-bert": 7, "toy-neox": 11}  # model: seed
STEPS = (0, 64, 512)  # "step512" sorts before "step64" as text: scan must order by number
TOKENS_PER_STEP = 1024
NO_EXTRACT_JSON = ("toy-neox", 512)  # the one checkpoint without extract.json: its tokens_seen is unknown

IDENTITY_TYPES = {"family": pl.String, "model": pl.String, "seed": pl.Int64, "step": pl.Int64, "tokens_seen": pl.Int64}


def value(model: str, step: int, layer: int) -> float:
    return (1 if model == "toy-bert" else -1) * (step + 0.25 * layer)


def tokens(model: str, step: int) -> int | None:
    return None if (model, step) == NO_EXTRACT_JSON else step * TOKENS_PER_STEP


@pytest.fixture
def results(tmp_path):
    """results/toy/{toy-bert,toy-neox}/step{0,64,512}/ with metrics (identity columns; toy-neox's files with one
    more column and layer as Int32), probe (no identity column at all), extract.json (but one), and per model
    sweep, qk_svd (step but no seed/tokens_seen) and bases (no identity column); plus what scan must skip."""
    root = tmp_path / "results"
    for model, seed in MODELS.items():
        model_dir = root / "toy" / model
        for step in STEPS:
            d = model_dir / f"step{step}"
            d.mkdir(parents=True)
            metrics = pl.DataFrame(
                {
                    "family": ["toy", "toy"],
                    "model": [model, model],
                    "seed": [seed, seed],
                    "step": [step, step],
                    "tokens_seen": [step * TOKENS_PER_STEP] * 2,
                    "layer": [0, 1],
                    "metric": ["avg_cos", "drift_norm"],
                    "value": [value(model, step, 0), value(model, step, 1)],
                }
            )
            if model == "toy-neox":
                metrics = metrics.with_columns(pl.col("layer").cast(pl.Int32), extra=pl.lit("x"))
            metrics.write_parquet(d / "metrics.parquet")
            pl.DataFrame({"layer": [0, 1, 2], "value": [value(model, step, k) for k in range(3)]}).write_parquet(
                d / "probe.parquet"
            )
            if (model, step) != NO_EXTRACT_JSON:
                checkpoint = {
                    "family": "toy",
                    "model": model,
                    "step": step,
                    "seed": seed,
                    "tokens_seen": tokens(model, step),
                }
                (d / "extract.json").write_text(json.dumps({"checkpoint": checkpoint, "n_valid_tokens": 10}))
            (d / ".metrics.parquet.1a2b3c4d.tmp").write_bytes(b"half a file")  # an atomic write under way
        sweep = pl.read_parquet([model_dir / f"step{s}" / "metrics.parquet" for s in STEPS])
        sweep.with_columns(status=pl.lit("ok")).write_parquet(model_dir / "sweep.parquet")
        pl.DataFrame({"step": [512, 0], "sv": [2.0, 1.0]}).write_parquet(model_dir / "qk_svd.parquet")
        pl.DataFrame({"layer": [0], "rank": [4]}).write_parquet(model_dir / "bases.parquet")
        (model_dir / "figures").mkdir()
        (model_dir / "figures" / "isotropy.png").write_bytes(b"png")
        (model_dir / "notastep").mkdir()
        pl.DataFrame({"x": [1]}).write_parquet(model_dir / "notastep" / "stray.parquet")
    (root / "untrained").mkdir()
    pl.DataFrame({"x": [1]}).write_parquet(root / "untrained" / "summary.parquet")  # family level: not a table here
    return root


def with_types(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={**IDENTITY_TYPES, **schema}, orient="row")


def test_tables_lists_checkpoint_and_model_tables(results):
    assert tables(results) == ["bases", "metrics", "probe", "qk_svd", "sweep"]
    assert tables(str(results)) == tables(results)


def expected_metrics(**more) -> pl.DataFrame:
    """Every checkpoint's metrics rows, by model and step, with the columns in `more` (name: (value, type))."""
    return with_types(
        [
            {
                "family": "toy",
                "model": model,
                "seed": seed,
                "step": step,
                "tokens_seen": step * TOKENS_PER_STEP,
                "layer": layer,
                "metric": metric,
                "value": value(model, step, layer),
                "extra": None if model == "toy-bert" else "x",
                **{name: v for name, (v, _) in more.items()},
            }
            for model, seed in MODELS.items()
            for step in STEPS
            for layer, metric in ((0, "avg_cos"), (1, "drift_norm"))
        ],
        {
            "layer": pl.Int64,
            "metric": pl.String,
            "value": pl.Float64,
            "extra": pl.String,
            **{name: t for name, (_, t) in more.items()},
        },
    )


def test_scan_metrics_every_checkpoint_in_step_order(results):
    expected = expected_metrics()
    got = scan(results)
    assert isinstance(got, pl.LazyFrame)
    assert_frame_equal(got.collect(), expected)
    assert_frame_equal(scan(results, "metrics.parquet").collect(), expected)  # the file's name works too


def test_scan_filter_example_from_the_docstring(results):
    got = scan(str(results)).filter(pl.col("metric") == "avg_cos").select("model", "step", "value").collect()
    expected = pl.DataFrame(
        [(m, s, value(m, s, 0)) for m in MODELS for s in STEPS],
        schema={"model": pl.String, "step": pl.Int64, "value": pl.Float64},
        orient="row",
    )
    assert_frame_equal(got, expected)


def test_scan_derives_identity_from_path_and_extract_json(results):
    expected = with_types(
        [
            {
                "family": "toy",
                "model": model,
                "seed": None if (model, step) == NO_EXTRACT_JSON else seed,
                "step": step,
                "tokens_seen": tokens(model, step),
                "layer": layer,
                "value": value(model, step, layer),
            }
            for model, seed in MODELS.items()
            for step in STEPS
            for layer in range(3)
        ],
        {"layer": pl.Int64, "value": pl.Float64},
    )
    assert_frame_equal(scan(results, "probe").collect(), expected)


def test_scan_per_model_tables(results):
    # toy-neox's sweep has the extra column, toy-bert's not: concatenated diagonally
    expected_sweep = expected_metrics(status=("ok", pl.String))
    assert_frame_equal(scan(results, "sweep").collect(), expected_sweep, check_column_order=False)

    # qk_svd has a step: seed and tokens_seen are looked up in that step's extract.json (row order kept)
    expected_svd = with_types(
        [
            {
                "family": "toy",
                "model": model,
                "seed": None if (model, step) == NO_EXTRACT_JSON else seed,
                "step": step,
                "tokens_seen": tokens(model, step),
                "sv": sv,
            }
            for model, seed in MODELS.items()
            for step, sv in ((512, 2.0), (0, 1.0))
        ],
        {"sv": pl.Float64},
    )
    assert_frame_equal(scan(results, "qk_svd").collect(), expected_svd)

    # bases has no step: step and tokens_seen are null, the seed is the model's own
    expected_bases = with_types(
        [
            {"family": "toy", "model": m, "seed": seed, "step": None, "tokens_seen": None, "layer": 0, "rank": 4}
            for m, seed in MODELS.items()
        ],
        {"layer": pl.Int64, "rank": pl.Int64},
    )
    assert_frame_equal(scan(results, "bases").collect(), expected_bases)


def test_missing_root_names_root_and_table(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))) as error:
        scan(missing, "metrics")
    assert "'metrics'" in str(error.value) and "does not exist" in str(error.value)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        tables(missing)
    a_file = tmp_path / "results.parquet"
    a_file.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        scan(a_file)


def test_unknown_table_lists_the_tables_there(results):
    with pytest.raises(ValueError) as error:
        scan(results, "metircs")
    message = str(error.value)
    assert "metircs.parquet" in message and str(results) in message
    assert "per checkpoint: metrics, probe; per model: bases, qk_svd, sweep" in message
    # a per-model name asked for at checkpoint level, and the reverse
    with pytest.raises(ValueError, match=r"no sweep\.parquet .*step\{N\}/\);"):
        scan(results, "sweep", level="checkpoint")
    with pytest.raises(ValueError, match=r"no metrics\.parquet"):
        scan(results, "metrics", level="model")


def test_empty_root_says_no_tables(tmp_path):
    (tmp_path / "toy" / "toy-bert" / "step0").mkdir(parents=True)
    with pytest.raises(ValueError, match="no metrics.parquet under .*; tables there: none"):
        scan(tmp_path)
    assert tables(tmp_path) == []


def test_a_name_at_both_levels_needs_level(results):
    step_dir = results / "toy" / "toy-bert" / "step0"
    pl.DataFrame({"step": [0], "v": [1.0]}).write_parquet(step_dir / "sweep.parquet")
    with pytest.raises(ValueError, match="both a per-checkpoint and a per-model table.*level="):
        scan(results, "sweep")
    one = scan(results, "sweep", level="checkpoint").collect()
    assert one.select("family", "model", "seed", "step", "tokens_seen", "v").rows() == [
        ("toy", "toy-bert", 7, 0, 0, 1.0)
    ]
    assert scan(results, "sweep", level="model").collect().height == len(MODELS) * len(STEPS) * 2


@pytest.mark.parametrize("bad", ["", "toy/metrics", ".hidden"])
def test_bad_table_names(results, bad):
    with pytest.raises(ValueError, match="give a table's name"):
        scan(results, bad)


def test_bad_level(results):
    with pytest.raises(ValueError, match="level 'step'"):
        scan(results, "metrics", level="step")


def test_unreadable_extract_json_is_named(results):
    broken = results / "toy" / "toy-bert" / "step64" / "extract.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(broken))):
        scan(results, "probe")
    scan(results, "metrics").collect()  # a table with its own identity columns never reads extract.json
