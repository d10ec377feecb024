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


def take(source: str | Path, step: int, names: Sequence[str], out_dir: str | Path, run: str | None = None) -> None:
    """Step `step`'s files `names` into `out_dir`: copied from `source/step{N}/`, each written whole and renamed;
    when that is `out_dir` itself, a check that they are there. `source` is live local run `run`'s folder (the
    callback's), or without `run` a live toy's (train-toy --out)."""
    folder, out_dir = Path(source) / f"step{step}", Path(out_dir)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing and run is not None:
        why = " (the callback ran with gradients disabled there)" if "gradients.parquet" in missing else ""
        hint = missing_step_hint(step)
        raise FileNotFoundError(f"local/{run}/step{step}: {folder} lacks {', '.join(missing)}{why}; {hint}")
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: the live toy did not analyse step {step} (with the gradient "
            f"analysis, when gradients.parquet is missing); delete {source} to train and analyse it again"
        )
    if folder.resolve() != out_dir.resolve():
        copy_files(folder, names, out_dir)
