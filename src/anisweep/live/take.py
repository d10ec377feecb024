"""Take a live run's step into the results: copy the files the callback wrote (or check they are in place)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from anisweep.atomic import copy_files
from anisweep.checkpoints.local import _STEP, _hint


def take(run: str, source: str | Path, step: int, names: Sequence[str], out_dir: str | Path) -> None:
    """Step `step`'s files `names` of live local run `run` into `out_dir`: copied from `source/step{N}/`, each
    written whole and renamed; when that is `out_dir` itself, a check that they are there."""
    folder, out_dir = Path(source) / f"{_STEP}{step}", Path(out_dir)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        why = " (the callback ran with gradients disabled there)" if "gradients.parquet" in missing else ""
        raise FileNotFoundError(f"local/{run}/step{step}: {folder} lacks {', '.join(missing)}{why}; {_hint(step)}")
    if folder.resolve() != out_dir.resolve():
        copy_files(folder, names, out_dir)
