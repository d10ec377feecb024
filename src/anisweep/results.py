"""Reading a results folder from Python: one lazy polars frame per table, over every checkpoint or every model.

The pipeline writes one Parquet file per table and checkpoint, ``{root}/{family}/{model}/step{N}/{table}.parquet``
(``metrics``, ``qk``, ``attention``, ``hidden``, ``spectra``, ``gradients``, ...), and a few per model,
``{root}/{family}/{model}/{table}.parquet`` (``sweep``, ``gradients_sweep``, ``qk_svd``, ...). :func:`scan` puts
all files of one table into one :class:`polars.LazyFrame`; nothing is read until ``.collect()``::

    import polars as pl
    from anisweep.results import scan, tables

    tables("results")  # ['attention', 'embeddings', ..., 'sweep']
    avg_cos = scan("results").filter(pl.col("metric") == "avg_cos").collect()  # every checkpoint's metrics
    sweep = scan("results", "sweep").collect()  # every model's sweep table

The Multi-Bootstrap's tables are one table, ``bootstrap``: every model's ``{root}/{family}/{model}/bootstrap.parquet``,
then every group's ``{root}/bootstrap/{group}.parquet`` and every comparison's
``{root}/bootstrap/compare/{name}.parquet``; :func:`changes` lists the steps where a measure moves beyond its interval::

    intervals = scan("results", "bootstrap").filter(pl.col("against").is_null()).collect()
    moved = changes("results")  # each step test against the previous step whose interval leaves out 0

Every row carries the identity columns family, model, seed, step and tokens_seen (String, String, Int64, Int64,
Int64), first and in that order. The pipeline's tables already carry them; where a file lacks one, family, model
and step come from its path, and seed and tokens_seen from the checkpoint's ``extract.json`` (its
``checkpoint`` entry, the fetch manifest), else null. Files of one table whose schemas differ are concatenated
diagonally (a column one file lacks is null in its rows; differing types are cast to a common one).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from anisweep.tables import IDENTITY, IDENTITY_SCHEMA, scan_parquet

__all__ = ["LEVELS", "changes", "changes_in", "scan", "tables"]

#: Where a table lives: one file per checkpoint (``{family}/{model}/step{N}/``) or per model (``{family}/{model}/``).
LEVELS = ("checkpoint", "model")

_STEP = re.compile(r"step(\d+)")
_SUFFIX = ".parquet"
#: the Multi-Bootstrap's tables of groups of seeds ({root}/bootstrap/{group}.parquet) and of comparisons of two
#: groups ({root}/bootstrap/compare/{name}.parquet): read as rows of table "bootstrap", never as a family's models
BOOTSTRAP = "bootstrap"


@dataclass(frozen=True)
class _File:
    path: Path
    family: str
    model: str
    step: int | None  # None for a per-model table


def _folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _parquets(folder: Path) -> list[tuple[str, Path]]:
    """(table name, path) of the Parquet files in `folder`; hidden files (atomic writes under way) left out."""
    return sorted(
        (p.name[: -len(_SUFFIX)], p)
        for p in folder.iterdir()
        if p.name.endswith(_SUFFIX) and len(p.name) > len(_SUFFIX) and not p.name.startswith(".") and p.is_file()
    )


def _steps(model_dir: Path) -> list[tuple[int, Path]]:
    """The step{N}/ folders of a model, by step."""
    return sorted((int(m[1]), d) for d in _folders(model_dir) if (m := _STEP.fullmatch(d.name)))


def _root(root: str | os.PathLike, table: str | None = None) -> Path:
    path = Path(root)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        wanted = f" (looking for table {table!r})" if table is not None else ""
        raise FileNotFoundError(
            f"results root {str(path)!r}{wanted} {what}: run the pipeline first, or pass root= the folder it "
            "wrote results into (the one holding {family}/{model}/step{N}/)"
        )
    return path


def _find(root: Path) -> dict[str, dict[str, list[_File]]]:
    """{level: {table: files}}, families, models and steps in order (steps numerically)."""
    found: dict[str, dict[str, list[_File]]] = {level: {} for level in LEVELS}
    for family in _folders(root):
        if family.name == BOOTSTRAP:
            continue
        for model in _folders(family):
            for name, path in _parquets(model):
                found["model"].setdefault(name, []).append(_File(path, family.name, model.name, None))
            for step, folder in _steps(model):
                for name, path in _parquets(folder):
                    found["checkpoint"].setdefault(name, []).append(_File(path, family.name, model.name, step))
    return found


def _listing(found: dict[str, dict[str, list[_File]]]) -> str:
    parts = [f"per {level}: {', '.join(sorted(found[level]))}" for level in LEVELS if found[level]]
    return "; ".join(parts) if parts else "none"


def tables(root: str | os.PathLike = "results") -> list[str]:
    """The names of the tables under `root`, per checkpoint and per model, sorted.

    >>> tables("results")  # doctest: +SKIP
    ['attention', 'embeddings', 'hidden', ..., 'metrics', 'qk', 'qk_sample', 'qk_svd', 'score_hist', 'spectra', 'sweep']

    Raises FileNotFoundError when `root` is not a folder.
    """
    path = _root(root)
    found = _find(path)
    pooled = {BOOTSTRAP} if _pooled_files(path) else set()
    return sorted({name for level in LEVELS for name in found[level]} | pooled)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _written(step_dir: Path) -> dict:
    """seed and tokens_seen from a checkpoint's extract.json (its `checkpoint` entry); {} without one."""
    info = step_dir / "extract.json"
    if not info.is_file():
        return {}
    try:
        checkpoint = json.loads(info.read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{info} cannot be read as extract's JSON ({error})") from None
    if not isinstance(checkpoint, dict):
        return {}
    return {key: _int(checkpoint.get(key)) for key in ("seed", "tokens_seen")}


def _identified(frame: pl.LazyFrame, names: list[str], identity: dict[str, pl.Expr]) -> pl.LazyFrame:
    """`frame` with the identity columns it lacks added from `identity`, all of them cast and put first."""
    added = [identity[key].alias(key) for key in IDENTITY if key not in names]
    if added:
        frame = frame.with_columns(added)
    typed = [pl.col(key).cast(dtype) for key, dtype in IDENTITY_SCHEMA.items()]
    return frame.select(*typed, *[c for c in names if c not in IDENTITY])


def _checkpoint_frame(file: _File) -> pl.LazyFrame:
    frame = scan_parquet(file.path, glob=False, hive_partitioning=False)
    names = frame.collect_schema().names()
    written = _written(file.path.parent) if {"seed", "tokens_seen"} - set(names) else {}
    identity = {
        "family": pl.lit(file.family, pl.String),
        "model": pl.lit(file.model, pl.String),
        "seed": pl.lit(written.get("seed"), pl.Int64),
        "step": pl.lit(file.step, pl.Int64),
        "tokens_seen": pl.lit(written.get("tokens_seen"), pl.Int64),
    }
    return _identified(frame, names, identity)


def _model_frame(file: _File) -> pl.LazyFrame:
    """A per-model table: without a step column its rows get a null step and tokens_seen, and the model's seed
    when its checkpoints' extract.json agree on one; with one, seed and tokens_seen are looked up by step."""
    frame = scan_parquet(file.path, glob=False, hive_partitioning=False)
    names = frame.collect_schema().names()
    by_step = {}
    if {"seed", "tokens_seen"} - set(names):
        by_step = {step: _written(folder) for step, folder in _steps(file.path.parent)}
    identity = {"family": pl.lit(file.family, pl.String), "model": pl.lit(file.model, pl.String)}
    if "step" in names:
        for key in ("seed", "tokens_seen"):
            mapping = {step: written[key] for step, written in by_step.items() if written.get(key) is not None}
            step = pl.col("step").cast(pl.Int64, strict=False)
            identity[key] = step.replace_strict(mapping, default=None, return_dtype=pl.Int64)
    else:
        seeds = {written.get("seed") for written in by_step.values()} - {None}
        identity["seed"] = pl.lit(seeds.pop() if len(seeds) == 1 else None, pl.Int64)
        identity["step"] = pl.lit(None, pl.Int64)
        identity["tokens_seen"] = pl.lit(None, pl.Int64)
    return _identified(frame, names, identity)


def _pooled_files(root: Path) -> list[Path]:
    """The bootstrap tables of groups, then of comparisons, by name."""
    folder = root / BOOTSTRAP
    groups = _parquets(folder) if folder.is_dir() else []
    compared = _parquets(folder / "compare") if (folder / "compare").is_dir() else []
    return [path for _, path in groups + compared]


def _pooled_frame(path: Path) -> pl.LazyFrame:
    """A group's or a comparison's table: its own identity columns (model and seed null), any it lacks null."""
    frame = scan_parquet(path, glob=False, hive_partitioning=False)
    names = frame.collect_schema().names()
    return _identified(frame, names, {key: pl.lit(None, dtype) for key, dtype in IDENTITY_SCHEMA.items()})


def scan(root: str | os.PathLike = "results", table: str = "metrics", *, level: str | None = None) -> pl.LazyFrame:
    """One lazy frame over every `{table}.parquet` under `root`, with family, model, seed, step and tokens_seen.

    A per-checkpoint table (``{root}/{family}/{model}/step{N}/{table}.parquet``: metrics, qk, attention, hidden,
    spectra, ...) is read from every checkpoint, a per-model one (``{root}/{family}/{model}/{table}.parquet``:
    sweep, gradients_sweep, qk_svd, ...) from every model; which one `table` is, is found on disk (`level`,
    ``"checkpoint"`` or ``"model"``, says it where a name exists at both). Rows come by family, model and step.
    ``"bootstrap"`` adds, after the models' tables, the groups' (``{root}/bootstrap/{group}.parquet``, column
    ``group``) and the comparisons' (``{root}/bootstrap/compare/{name}.parquet``, column ``comparison``), by name.

    >>> import polars as pl
    >>> scan("results").filter(pl.col("metric") == "avg_cos").collect()  # doctest: +SKIP
    >>> scan("results", "sweep").filter(pl.col("model") == "toy-bert").collect()  # doctest: +SKIP
    >>> scan("results", "qk").group_by("model", "step").agg(pl.col("qk_cos").abs().mean()).collect()  # doctest: +SKIP

    Raises FileNotFoundError when `root` is not a folder, and ValueError, naming the tables that are there,
    when no `{table}.parquet` is.
    """
    if table.endswith(_SUFFIX):
        table = table[: -len(_SUFFIX)]
    if not table or "/" in table or os.sep in table or table.startswith("."):
        raise ValueError(f"table {table!r}: give a table's name, such as 'metrics' or 'sweep' (no folder, no suffix)")
    if level is not None and level not in LEVELS:
        raise ValueError(f"level {level!r}: one of {', '.join(LEVELS)}, or None to find it on disk")
    path = _root(root, table)
    found = _find(path)
    levels = [lv for lv in LEVELS if table in found[lv] and level in (None, lv)]
    pooled = _pooled_files(path) if table == BOOTSTRAP and level in (None, "model") else []
    if pooled:
        frames = [_model_frame(file) for file in found["model"].get(table, [])] + [_pooled_frame(p) for p in pooled]
        return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    if not levels:
        where = {
            "checkpoint": f"{path}/{{family}}/{{model}}/step{{N}}/",
            "model": f"{path}/{{family}}/{{model}}/",
        }
        looked = " or ".join(where[lv] for lv in LEVELS if level in (None, lv))
        raise ValueError(
            f"no {table}.parquet under results root {str(path)!r} (looked in {looked}); tables there: {_listing(found)}"
        )
    if len(levels) > 1:
        raise ValueError(
            f"{table}.parquet is both a per-checkpoint and a per-model table under {str(path)!r}: "
            "pass level='checkpoint' or level='model'"
        )
    build = _checkpoint_frame if levels[0] == "checkpoint" else _model_frame
    frames = [build(file) for file in found[levels[0]][table]]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


#: what changes() keeps of a step test, besides the identity columns
_CHANGE_COLUMNS = ("group", "models", "layer", "site", "metric", "against", "ref_step")
_CHANGE_STATISTICS = ("low", "high", "p", "level", "n_seeds", "n_units", "samples", "design")


def changes_in(table: pl.DataFrame | pl.LazyFrame, *, against: str = "previous") -> pl.DataFrame:
    """The step tests of bootstrap tables (rows of `scan(root, "bootstrap")`, or one model's or group's table) whose
    interval of the difference leaves out 0: each step where a measure moved, beyond its interval, from the previous
    step (`against="final"`: where it still differs from the final step). `difference` is the value at `step` minus
    the value at `ref_step`, `direction` "rise" or "fall"; a test whose interval is undefined (NaN) is left out, as
    are the intervals of the comparisons of two steps (CKA, SVCCA, PWCCA: rows with a ref_step and no p)."""
    if against not in ("previous", "final"):
        raise ValueError(f"against {against!r}: 'previous' (each step against the one before) or 'final'")
    frame = table.lazy()
    names = frame.collect_schema().names()
    missing = [c for c in ("against", "ref_step", "estimate", "low", "high", "p") if c not in names]
    if missing:
        raise ValueError(f"not a bootstrap table (no column {missing}): give rows of scan(root, 'bootstrap')")
    if "group" not in names:
        frame = frame.with_columns(group=pl.lit(None, pl.String))
    defined = pl.col("low").is_not_nan() & pl.col("high").is_not_nan()  # polars orders NaN above every number
    beyond = defined & ((pl.col("low") > 0) | (pl.col("high") < 0))
    kept = [c for c in (*IDENTITY, *_CHANGE_COLUMNS) if c in names or c == "group"]
    statistics = [c for c in _CHANGE_STATISTICS if c in names]
    return (
        frame.filter((pl.col("against") == against) & pl.col("p").is_not_null() & beyond)  # p: a test's, not a pair's
        .select(
            *kept,
            pl.col("estimate").alias("difference"),
            *statistics,
            pl.when(pl.col("low") > 0).then(pl.lit("rise")).otherwise(pl.lit("fall")).alias("direction"),
        )
        .sort("family", "model", "group", "metric", "layer", "site", "step", nulls_last=False)
        .collect()
    )


def changes(root: str | os.PathLike = "results", *, against: str = "previous") -> pl.DataFrame:
    """Every model's and group's steps where a measure changes beyond its interval (changes_in over
    `scan(root, "bootstrap")`): the step tests against the previous step whose difference's interval leaves out 0.

    >>> changes("results").select("model", "group", "metric", "layer", "step", "difference", "p")  # doctest: +SKIP

    Raises FileNotFoundError when `root` is not a folder, and ValueError when it holds no bootstrap table."""
    return changes_in(scan(root, BOOTSTRAP), against=against)
