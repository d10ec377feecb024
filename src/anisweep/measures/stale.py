"""What the workflow keeps of a user's measures between runs: the identity of each stream measure's code (the one
input of extract that says when to run the model again for it), and no table or figure of a measure the config no
longer names."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path


def code_record(path: str | Path, identities: Mapping[str, str]) -> str:
    """What `path` should hold: {measure: code identity} as sorted JSON, the measures recorded there and no longer
    named kept, the others as `identities` gives them ("" while there is none). Reads `path` and writes nothing: the
    workflow's rule stream_measure_code writes this text and records it as its param, so that it runs again (and
    extract after it) when a measure is new or its identity changed, never after a removal, and reading or
    dry-running the workflow changes nothing."""
    path = Path(path)
    try:
        recorded = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        recorded = {}  # damaged: written again whole
    record = {**(recorded if isinstance(recorded, dict) else {}), **identities}
    return json.dumps(record, indent=2, sort_keys=True) if record or path.is_file() else ""


def stale_measure_outputs(results: str | Path, models: Iterable[tuple[str, str]], names: Iterable[str]) -> list[Path]:
    """The tables (`step*/measures/{name}.parquet`) and figures (`figures/measure_{name}.png`) of `models` whose
    measure is not among `names`."""
    keep = set(names)
    stale = []
    for family, model in models:
        folder = Path(results) / family / model
        tables = [(p, p.stem) for p in folder.glob("step*/measures/*.parquet")]
        figures = [(p, p.stem.removeprefix("measure_")) for p in folder.glob("figures/measure_*.png")]
        stale += [path for path, name in tables + figures if name not in keep]
    return sorted(stale)


def remove_stale_measure_outputs(
    results: str | Path, models: Iterable[tuple[str, str]], names: Iterable[str]
) -> list[Path]:
    """Delete `stale_measure_outputs`, saying which measures they were of; returns them."""
    stale = stale_measure_outputs(results, models, names)
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        gone = sorted({p.stem.removeprefix("measure_") for p in stale})
        print(f"removed {len(stale)} tables and figures of measures no longer in the config: {', '.join(gone)}")
    return stale
