"""The weights a run's fetch downloaded, shared with the jobs of the same run that read them after extract has
deleted its folder (the weight measures, the logit lens), so that each byte moves once.

fetch gives each such job a copy of its folder made of hard links (`share`): no byte is copied, and the files'
space is freed once the last of the folder and its copies is removed. The job reads its copy in place
(`fetched_source`) and removes it when it ends (`release`); a job with no copy (not in the run that fetched: a
rerun of the job alone, `snakemake weights_only`) reads by range requests. Weights fetch did not download (a
local run, the Hugging Face cache with fetch.keep_weights or offline) are not shared: the jobs read them where
they are.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from anisweep.weights.source import LocalSource

MANIFEST = "checkpoint.json"  # anisweep.checkpoints.fetch's
SHARED = "shared.json"  # in a copy: where its model folder and tokenizer are


def _inside(path: Path, folder: Path) -> Path | None:
    """`path` relative to `folder`, or None where it lies elsewhere."""
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return None


def share(folder: str | Path, copies: list[str | Path]) -> list[Path]:
    """A copy of the fetched `folder` (its manifest and the weights it downloaded) by hard links at each of `copies`,
    where fetch downloaded the weights into it; the copies made."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    model = _inside(Path(manifest["path"]), folder)
    if not copies or not manifest.get("repo_id") or model is None:
        return []
    tokenizer = manifest.get("tokenizer_path")
    where = {"model": model.as_posix(), "tokenizer": None}
    if tokenizer and (inside := _inside(Path(tokenizer), folder)) is not None:
        where["tokenizer"] = inside.as_posix()
    made = []
    for copy in map(Path, copies):
        partial = copy.with_name(copy.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            shutil.copytree(folder, partial, symlinks=True, copy_function=os.link)
        except OSError as error:  # a file system without hard links: the jobs read by range requests
            shutil.rmtree(partial, ignore_errors=True)
            print(
                f"fetch: could not share the weights by hard links ({error}): read by range requests", file=sys.stderr
            )
            return made
        (partial / SHARED).write_text(json.dumps(where))
        shutil.rmtree(copy, ignore_errors=True)
        partial.rename(copy)
        made.append(copy)
    print(f"fetch: shared the weights with {', '.join(str(c) for c in made)} (hard links)", file=sys.stderr)
    return made


def fetched_source(copy: str | Path | None) -> tuple[LocalSource, Path | None] | None:
    """(the source over the copy fetch shared, its tokenizer folder), or None where there is no copy."""
    if copy is None or not (Path(copy) / SHARED).is_file():
        return None
    copy = Path(copy)
    where = json.loads((copy / SHARED).read_text())
    print(f"weights: read in place in the copy fetch shared, {copy}", file=sys.stderr)
    return LocalSource(copy / where["model"]), copy / where["tokenizer"] if where["tokenizer"] is not None else None


def release(copy: str | Path | None) -> None:
    """The job's copy removed (its files' space freed once no other copy holds them)."""
    if copy is not None:
        shutil.rmtree(copy, ignore_errors=True)
