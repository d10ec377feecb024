"""Take a step of a model analysed while it trained into the results: copy the files the analysis wrote (or check
they are in place), and the identity columns its rows carry. No torch: the workflow's take steps import this."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from anisweep.atomic import copy_files
from anisweep.checkpoints.local import missing_step_hint


def live_ident(
    model: str, step: int, tokens_per_step: int | None = None, seed: int | None = None, family: str = "local"
) -> dict:
    """The identity columns of step `step` of `model` analysed while it trains: a live local run's (family
    `local`), or a live toy's (family `toy`, as a saved toy checkpoint's rows carry them, checkpoints.toy.Toy)."""
    return {
        "family": family,
        "model": model,
        "seed": seed,
        "step": step,
        "tokens_seen": None if tokens_per_step is None else step * tokens_per_step,
    }


def take(
    source: str | Path,
    step: int,
    names: Sequence[str],
    out_dir: str | Path,
    run: str | None = None,
    empty: Sequence[str] = (),
) -> None:
    """Step `step`'s files `names` into `out_dir`: copied from `source/step{N}/`, each written whole and renamed;
    when that is `out_dir` itself, a check that they are there. `source` is live local run `run`'s folder (the
    callback's), or without `run` a live toy's (train-toy --out). `empty`: the backward pass's tables of a step the
    gradient analysis does not cover, written without rows where the analysis did not write them."""
    folder, out_dir = Path(source) / f"step{step}", Path(out_dir)
    _write_empty([name for name in empty if not (folder / name).is_file()], out_dir, step)
    names = [*names, *(name for name in empty if (folder / name).is_file())]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing and run is not None:
        why = " (the callback ran with gradients disabled there)" if "gradient_sums.parquet" in missing else ""
        hint = missing_step_hint(step)
        raise FileNotFoundError(f"local/{run}/step{step}: {folder} lacks {', '.join(missing)}{why}; {hint}")
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: the live toy did not analyse step {step} (with the gradient "
            f"analysis, when gradient_sums.parquet is missing); delete {source} to train and analyse it again"
        )
    if folder.resolve() != out_dir.resolve():
        copy_files(folder, names, out_dir)


def _write_empty(names: Sequence[str], out_dir: Path, step: int) -> None:
    if not names:
        return
    import polars as pl

    from anisweep.tables import write_atomic
    from anisweep.tangent.embedding_change import EMBEDDING_SCHEMA
    from anisweep.tangent.pass_tables import SAMPLE_SCHEMA, SUMS_SCHEMA

    schemas = {"gradient_sums": SUMS_SCHEMA, "gradient_sample": SAMPLE_SCHEMA, "embedding_rows": EMBEDDING_SCHEMA}
    for name in names:
        write_atomic(pl.DataFrame(schema=schemas[name.removesuffix(".parquet")]), out_dir / name)
