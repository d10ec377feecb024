"""What a checkpoint's results depend on outside the config's settings: its identity (tokens seen, seed, the
Hub revision) and, for a folder on disk, the content of that folder. A rule that records it as a parameter is
rerun by Snakemake when it changes: a local run saved again into the same `step{N}/` folders, or the tables a
live run's callback wrote again, are analysed again.

A folder's content is named by each regular file's name, size and modification time (no hashing: a sweep has
hundreds of checkpoints of GBs each, and reading them to plan a run would cost as much as the run). Copying a
run elsewhere keeps the names and sizes but not the times: its checkpoints are then analysed again (or run
Snakemake with `--rerun-triggers mtime input code` once).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from anisweep.checkpoints.base import Checkpoint
from anisweep.tables import TOKEN_COUNTS


def folder_content(folder: str | Path, names: Iterable[str] | None = None) -> dict[str, list[int]]:
    """{file name: [size, mtime in ns]} of the folder's regular files (those of `names` only, when given); {} when
    it does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    content = {}
    chosen = None if names is None else set(names)
    for path in sorted(folder.iterdir()):
        if path.is_file() and (chosen is None or path.name in chosen):
            stat = path.stat()
            content[path.name] = [stat.st_size, stat.st_mtime_ns]
    return content


def source_identity(checkpoint: Checkpoint, folder: str | Path | None = None) -> dict[str, Any]:
    """The checkpoint's identity without its path (moving a run does not change what it holds), and the content
    of `folder` (by default the checkpoint's own folder, for local runs). Toys are built by the workflow, whose
    training rule reruns what depends on them. A `hub` checkpoint is named by the commit its revision resolved to
    (a branch pushed again is analysed again), or, in a subfolder, by its files' blob ids."""
    identity = {key: value for key, value in checkpoint.to_dict().items() if key != "path"}
    if checkpoint.files_id is not None:  # a `hub` subfolder: named by its files, not by the commit of the whole repo
        identity.pop("commit", None)
    folder = folder if folder is not None else (checkpoint.path if checkpoint.family == "local" else None)
    if folder is not None:
        identity["content"] = folder_content(folder)
    return identity


def token_counts_identity(checkpoint: Checkpoint) -> dict[str, list[int]]:
    """The training corpus's token counts a user put into a local run's folder or its step folder (the gradient
    analysis's strata read them: anisweep.tangent.batch.read_token_counts), named as `folder_content` names
    files; {} for other families (a toy's are written by its training, which reruns what depends on it)."""
    if checkpoint.family != "local" or checkpoint.path is None:
        return {}
    step = Path(checkpoint.path)
    return {
        f"{where}/{name}": value
        for where, folder in (("step", step), ("run", step.parent))
        for name, value in folder_content(folder, [TOKEN_COUNTS]).items()
    }
