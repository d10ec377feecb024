"""What the workflow keeps of a user's measures between runs: the identity of each stream measure's code (the one
input of extract that says when to run the model again for it), and no table or figure of a measure the config no
longer names."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from anisweep.atomic import write_text


def record_code_identities(path: str | Path, identities: Mapping[str, str]) -> bool:
    """Record {measure: code identity} in `path`, keeping the measures recorded before and no longer named.
    Rewritten (a new modification time) only when a measure is new or its identity changed, so that the rules
    that read it rerun after an edit and never after a removal; returns whether it was rewritten."""
    path = Path(path)
    try:
        recorded = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        recorded = {}  # damaged: written again whole
    if path.is_file() and all(recorded.get(name) == code for name, code in identities.items()):
        return False
    if not identities and not path.is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps({**recorded, **identities}, indent=2, sort_keys=True), path)
    return True


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
