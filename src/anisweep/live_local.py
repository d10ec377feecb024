"""A user's run analysed while it trained (a `models` entry `{family: local, name, live: true}`): anisweep.live's
AnisweepCallback or analyse_live wrote extract's tables, extract.json and gradients.parquet of each analysed step
into `{path}/step{N}/`, no weights saved. The workflow sweeps those steps as it sweeps saved checkpoints: the
files are the extract and gradients outputs of checkpoint `local/{name}/step{N}` (`results/local/{name}/step{N}/`,
the callback's default folder, which is `path`'s default), so metrics, sweep and figures read them unchanged.
A `path` elsewhere is copied there, step by step (workflow/rules/live_local.smk).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .atomic import copy_files
from .sources import Checkpoint, ConfigError, LocalRun, _as_int, _check_name, select_steps

FAMILY = "local"
_STEP = "step"


def default_path(name: str) -> Path:
    """Where AnisweepCallback(results="results") writes run `name`: the workflow's own results folder for it."""
    return Path("results") / FAMILY / name


def run_folder(entry: dict) -> Path:
    return Path(str(entry["path"])).expanduser() if entry.get("path") else default_path(str(entry["name"]))


def extract_names() -> list[str]:
    from .tables import EXTRACT_TABLES

    return [*(f"{name}.parquet" for name in EXTRACT_TABLES), "extract.json"]


def _hint(step: int) -> str:
    return f"run AnisweepCallback (or analyse_live) at step {step}, or leave step {step} out of the entry's steps"


def resolve_live(name: str, path: Any, steps: Any, tokens_per_step: Any = None, seed: Any = None) -> list[Checkpoint]:
    """The analysed steps of a live local run: `steps: all` / `final` among the step{N}/ folders holding an
    extract.json; a listed step whose folder lacks extract's files is a ConfigError. tokens_seen and seed are the
    ones the callback wrote (extract.json's checkpoint), else step * tokens_per_step and the entry's seed."""
    _check_name(name, FAMILY)
    root = run_folder({"name": name, "path": path})
    where = f"local run {name!r} (live)"
    if not root.is_dir():
        raise ConfigError(
            f"{where}: {root} is not a folder; analyse the run with anisweep.live's AnisweepCallback "
            f"(results=..., run_name={name!r}) first, or set the entry's path to the folder it wrote"
        )
    if tokens_per_step is not None:
        tokens_per_step = _as_int(tokens_per_step, "tokens_per_step")
    if seed is not None:
        seed = _as_int(seed, "seed")
    folders = LocalRun.discover(root)
    analysed = [step for step, folder in folders.items() if (folder / "extract.json").is_file()]
    if not analysed:
        raise ConfigError(
            f"{where}: no step{{N}}/ folder of {root} holds an extract.json; run AnisweepCallback (or analyse_live) "
            "at the steps to sweep, or set the entry's path to the folder it wrote"
        )
    word = steps.strip().lower() if isinstance(steps, str) else None
    grid = analysed if word in ("all", "final", "last") else list(folders)
    chosen = select_steps(steps, grid, f"the analysed steps of {name} in {root}")
    out = []
    for step in chosen:
        folder = folders[step]
        missing = [n for n in extract_names() if not (folder / n).is_file()]
        if missing:
            raise ConfigError(f"{where}: {folder} lacks {', '.join(missing)}; {_hint(step)}")
        written = _written_identity(folder / "extract.json")
        tokens = written.get("tokens_seen")
        if tokens is None and tokens_per_step is not None:
            tokens = step * tokens_per_step
        out.append(
            Checkpoint(
                family=FAMILY,
                model=name,
                step=step,
                tokens_seen=tokens,
                seed=seed if seed is not None else written.get("seed"),
                path=str(folder),
            )
        )
    return out


def _written_identity(info: Path) -> dict:
    try:
        checkpoint = json.loads(info.read_text()).get("checkpoint") or {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"{info} cannot be read ({error}); run the callback at that step again") from None
    return checkpoint if isinstance(checkpoint, dict) else {}


def missing_gradients(checkpoints: Sequence[Checkpoint], steps: Sequence[int] | None) -> list[Path]:
    """The step folders among `checkpoints` the gradient analysis covers (`gradients.steps`, all when None)
    that hold no gradients.parquet."""
    return [
        Path(c.path)
        for c in checkpoints
        if (steps is None or c.step in steps) and not (Path(c.path) / "gradients.parquet").is_file()
    ]


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
