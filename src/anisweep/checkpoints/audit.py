"""An audit of a model's published grid before any weights move: is each checkpoint what its name says?

From file metadata only (anisweep.checkpoints.grid_listing: the repository's branches and, on each, the sha256
and size of every weight file; the shard index of a sharded branch, for the files it names and a shared shard's
tensors), every published checkpoint of the model (the catalogue's whole grid, inside the sweep or not, and every
other branch of its repositories: ``main``) gets one row of ``grid.parquet``, with its ``status``:

- ``ok``: weights of its own;
- ``duplicate``: its weight files are byte for byte another branch's (``repeats``, ``repeats_step``). Among
  identical branches the trusted one is kept: the final step of the catalogue and ``main`` (the defective branches
  serve the final model under early names, EleutherAI/pythia#205); a group without either is flagged whole, each
  member against the latest other one, since which of them holds what it claims is unknowable;
- ``partial``: some of its shards are another branch's (``shared_files``, ``shared_with``), naming the tensors they
  hold (from the shard index) and their layers (pythia-12b, EleutherAI/pythia#206);
- ``missing``: no branch of that name; ``no_weights``: a branch without weight files; ``incomplete``: a branch
  without some of the weight files its shard index names (``absent_files``; without an index read, those its
  shards' names announce), which ``from_pretrained`` cannot load; all three with the ``nearest`` steps that have
  weights of their own;
- ``unchecked``: nothing known of it (offline, and the cache does not hold it), or its weight files without the
  sha256 the Hub lists for LFS files.

What a flagged step gets in a sweep is the config's choice (``audit.flagged``): ``skip`` (default: a
``duplicate``, ``missing``, ``no_weights`` or ``incomplete`` step is not downloaded nor analysed, and listed in
``sweep.parquet`` with its status and the branch it repeats) or ``keep`` (downloaded, analysed and flagged; a
step without loadable weights fails at fetch). A ``partial`` step is always analysed, and flagged.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from huggingface_hub.errors import RepositoryNotFoundError

from anisweep.checkpoints.base import Checkpoint, nearest_steps
from anisweep.checkpoints.files import absent_shards, index_of, lacking
from anisweep.checkpoints.grid_listing import (
    HubUnreachable,
    Listing,
    cached_refs,
    hub_refs,
    is_offline,
    list_branches,
    read_index,
    read_indexes,
)
from anisweep.errors import ConfigError

GRID_FILE = "grid.parquet"
#: statuses a sweep does not download under `audit.flagged: skip`
SKIPPED = ("duplicate", "missing", "no_weights", "incomplete")
FLAGGED = (*SKIPPED, "partial")
#: statuses without weights a sweep could load, each reported with the nearest steps that have some
UNLOADABLE = ("missing", "no_weights", "incomplete")
#: the reasons of an `unchecked` step: the first needs the Hub (or a cache holding the branch), the second never
NOT_CACHED = "not in the cache"
NO_SHA256 = "weight files without an LFS sha256"
GRID_SCHEMA = {
    "family": pl.String,
    "model": pl.String,
    "repo_id": pl.String,
    "revision": pl.String,  # the branch (for a missing step, the name the catalogue gives it)
    "subfolder": pl.String,
    "step": pl.Int64,  # null for a branch that is no step of the grid (main)
    "name": pl.String,  # how the findings name it: the branch (repo@branch where the model spans repositories)
    "commit": pl.String,
    "source": pl.String,  # hub, cache, none
    "weight_files": pl.List(pl.String),
    "files_sha256": pl.List(pl.String),
    "files_bytes": pl.List(pl.Int64),
    "weights_bytes": pl.Int64,
    "weights_id": pl.String,  # sha256 over the sorted file hashes: equal means byte-identical weights
    "status": pl.String,
    "repeats": pl.String,
    "repeats_step": pl.Int64,
    "shared_files": pl.List(pl.String),
    "shared_with": pl.List(pl.String),
    "shared_tensors": pl.List(pl.String),
    "shared_layers": pl.List(pl.Int64),
    "indexed_files": pl.List(pl.String),  # the weight files its shard index names (null: no index read)
    "absent_files": pl.List(pl.String),  # those of them (or of its shards' names) the branch does not hold
    "nearest": pl.List(pl.Int64),
    "note": pl.String,
}
#: the columns a Hub model's sweep gets from the audit of its grid (with_audit)
AUDIT_COLUMNS = {"audit": pl.String, "repeats": pl.String}
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


class AuditError(RuntimeError):
    """The grid could not be audited where the config requires it (no network and nothing cached)."""


@dataclass(frozen=True)
class Unit:
    """One published checkpoint name: a catalogue step, or another branch of the model's repositories."""

    repo_id: str
    revision: str
    step: int | None
    subfolder: str | None = None


# ---------------------------------------------------------------------------------------------- the grid


def published_grid(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Every checkpoint the catalogue publishes for the model of ``checkpoints`` (its whole grid), with the
    config's own in place of the catalogue's where they meet (a `hub` family: the config's only)."""
    from anisweep.checkpoints.catalogue import family_of

    first = checkpoints[0]
    cls = family_of(first.family)
    steps: Iterable[int] = ()
    if hasattr(cls, "grid"):
        steps = cls.grid(first.model)
    elif hasattr(cls, "steps") and hasattr(cls, "checkpoint") and first.family != "hub":
        steps = cls.steps
    found = {}
    for step in steps:
        try:
            found[step] = cls.checkpoint(first.model, step)
        except ConfigError:  # a step the catalogue cannot name for this model: the config's own stand
            continue
    found |= {c.step: c for c in checkpoints}
    return [found[s] for s in sorted(found) if found[s].repo_id is not None]


def _match(revision: str, branches: Iterable[str]) -> str | None:
    """The branch a catalogue revision names (OLMo's `*` stands for the rounded token count)."""
    branches = list(branches)
    if "*" not in revision:
        return revision if revision in branches else None
    pattern = re.compile(re.escape(revision).replace(r"\*", r"\d+"))
    found = sorted(b for b in branches if pattern.fullmatch(b))
    return found[0] if found else None


def _weights(names: Iterable[str]) -> tuple[list[str], str]:
    """The weight files from_pretrained loads among a branch's files (anisweep.checkpoints.fetch.select_files), and
    the name of their shard index; ValueError when there are none."""
    from anisweep.checkpoints.files import select_files

    weights = select_files([*names, "config.json"])[1]
    return weights, index_of(weights)


def _weights_id(shas: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(shas)).encode()).hexdigest()


def _layers(tensors: Iterable[str]) -> list[int]:
    return sorted({int(m[1]) for t in tensors if (m := _LAYER.search(t))})


# ---------------------------------------------------------------------------------------------- audit


def audit_model(
    checkpoints: Sequence[Checkpoint],
    *,
    trusted_step: int | None = None,
    previous: pl.DataFrame | None = None,
    cache_dir: Path | str | None = None,
    api: Any = None,
) -> tuple[pl.DataFrame, list[str]]:
    """The grid table of the model of ``checkpoints`` (one Hub model) and notes on how it was audited (offline,
    from the cache only). A previous audit's table (``previous``) spares listing the branches whose commit is
    unchanged; when the Hub cannot be reached it stands for the Hub."""
    from huggingface_hub import HfApi

    grid = published_grid(checkpoints)
    family, model = checkpoints[0].family, checkpoints[0].model
    if trusted_step is None:
        from anisweep.checkpoints.catalogue import final_step

        trusted_step = final_step(list(checkpoints))
    api = api or HfApi()
    repos = sorted({c.repo_id for c in grid if c.repo_id})
    online = not is_offline()
    notes: list[str] = []
    old = _listings_of(previous)
    refs: dict[str, dict[str, str]] = {}
    from_cache: set[str] = set()
    no_repo: set[str] = set()
    for repo_id in repos:
        if online:
            try:
                refs[repo_id] = hub_refs(api, repo_id)
                continue
            except RepositoryNotFoundError:
                refs[repo_id] = {}
                no_repo.add(repo_id)
                continue
            except HubUnreachable as error:
                online = False
                notes.append(f"the Hub could not be reached ({error}): audited from what was cached")
        # the cache's refs are what fetch resolves through offline; the previous audit's name the branches it lacks
        known = {key[1]: key[3] for key in old if key[0] == repo_id}
        refs[repo_id] = known | cached_refs(repo_id, cache_dir)
        from_cache.add(repo_id)
    if is_offline():
        notes.insert(0, "HF_HUB_OFFLINE is set: audited from the Hugging Face cache and the previous audit only")

    units: list[Unit] = []
    for c in grid:
        branch = _match(c.revision or "main", refs.get(c.repo_id, {})) if c.repo_id in refs else None
        units.append(Unit(c.repo_id, branch or c.revision or "main", c.step, c.subfolder))
    used = {(u.repo_id, u.revision) for u in units}
    for repo_id in repos if family != "hub" else ():  # a `hub` entry's checkpoints are those of the config
        units += [Unit(repo_id, b, None) for b in sorted(refs.get(repo_id, {})) if (repo_id, b) not in used]
    listings = list_branches(
        {(u.repo_id, u.revision, u.subfolder) for u in units},
        refs,
        online=online,
        previous=old,
        cache_dir=cache_dir,
        api=api,
    )
    read_indexes(listings, cache_dir)
    by_unit = {(x.repo_id, x.branch, x.subfolder): x for x in listings}
    was_missing = set()
    if previous is not None and not previous.is_empty():
        gone = previous.filter(pl.col("status") == "missing")
        was_missing = set(zip(gone["repo_id"].to_list(), gone["revision"].to_list(), strict=True))
    guessed = {repo_id: was_missing for repo_id in from_cache}
    rows = _rows(units, by_unit, refs, family, model, many_repos=len(repos) > 1, guessed=guessed, no_repo=no_repo)
    _find(rows, trusted_step, by_unit, cache_dir)
    unchecked = sum(r["status"] == "unchecked" and NOT_CACHED in _reason(r) for r in rows)
    if from_cache and unchecked:
        notes.append(f"{unchecked} of {len(rows)} checkpoints could not be checked: {NOT_CACHED}")
    return pl.DataFrame(rows, schema=GRID_SCHEMA).sort("step", "name", nulls_last=True), notes


def _listings_of(table: pl.DataFrame | None) -> dict[tuple[str, str, str | None, str], Listing]:
    """A previous audit's listings, keyed by (repo, branch, subfolder, commit)."""
    out = {}
    if table is None or table.is_empty():
        return out
    for r in table.iter_rows(named=True):
        if r["commit"] is None or r["source"] == "none":
            continue
        files = dict(zip(r["weight_files"] or [], zip(r["files_sha256"] or [], r["files_bytes"] or [])))
        listing = Listing(
            r["repo_id"], r["revision"], r["commit"], r["subfolder"], files, r["source"], True, r["indexed_files"]
        )
        out[(r["repo_id"], r["revision"], r["subfolder"], r["commit"])] = listing
    return out


def _rows(units, by_unit, refs, family, model, *, many_repos, guessed, no_repo) -> list[dict[str, Any]]:
    """One row per unit. `guessed`: {repo: branches a previous audit found missing} for the repositories whose
    branches come from the cache or a previous audit, where a branch not there may well exist on the Hub."""
    rows = []
    for u in units:
        name = u.revision + (f"/{u.subfolder}" if u.subfolder else "")
        name = f"{u.repo_id}@{name}" if many_repos else name
        row: dict[str, Any] = {k: None for k in GRID_SCHEMA} | {
            "family": family,
            "model": model,
            "repo_id": u.repo_id,
            "revision": u.revision,
            "subfolder": u.subfolder,
            "step": u.step,
            "name": name,
            "source": "none",
        }
        repo_refs = refs.get(u.repo_id) or {}
        listing = by_unit.get((u.repo_id, u.revision, u.subfolder))
        if u.repo_id in no_repo:
            row |= {"status": "missing", "note": f"{name}: no repository {u.repo_id} on the Hub"}
        elif not repo_refs:
            row |= {"status": "unchecked", "note": f"{name}: nothing known of {u.repo_id} ({NOT_CACHED})"}
        elif u.revision not in repo_refs and u.repo_id in guessed and (u.repo_id, u.revision) not in guessed[u.repo_id]:
            row |= {"status": "unchecked", "note": f"{name}: {NOT_CACHED}"}
        elif u.revision not in repo_refs:
            row |= {"status": "missing", "note": f"{name}: no such branch in {u.repo_id}"}
        elif listing is None or listing.source == "none":
            row |= {"commit": repo_refs[u.revision], "status": "unchecked", "note": f"{name}: {NOT_CACHED}"}
        else:
            row |= {"commit": listing.commit, "source": listing.source} | _weights_row(name, listing)
        rows.append(row)
    return rows


def _weights_row(name: str, listing: Listing) -> dict[str, Any]:
    """A listed branch's weight files and its status as far as they tell: ``ok`` (with their ``weights_id``),
    ``no_weights``, ``incomplete``, or ``unchecked``."""
    try:
        weights, index = _weights(listing.files)
    except ValueError:
        if listing.complete:
            return {"status": "no_weights", "note": f"{name}: no *.safetensors or pytorch_model*.bin weights"}
        return {"status": "unchecked", "note": f"{name}: its weight files are {NOT_CACHED}"}
    shas = [listing.files[w][0] for w in weights]
    sizes = [listing.files[w][1] for w in weights]
    absent = absent_shards(weights, listing.indexed)
    row = {
        "weight_files": weights,
        "files_sha256": shas,
        "files_bytes": sizes,
        "weights_bytes": sum(s or 0 for s in sizes),
    }
    row |= {"indexed_files": listing.indexed, "absent_files": absent}
    if absent and listing.complete:
        gap = lacking(absent, index if listing.indexed is not None else None)
        return row | {"status": "incomplete", "note": f"{name}: {gap}: it cannot be loaded"}
    if absent:
        return row | {"status": "unchecked", "note": f"{name}: {', '.join(absent)} {NOT_CACHED}"}
    if any(s is None for s in shas):
        return row | {"status": "unchecked", "note": f"{name}: {NO_SHA256}"}
    return row | {"weights_id": _weights_id(shas), "status": "ok"}


def _find(rows: list[dict[str, Any]], trusted_step: int | None, by_unit, cache_dir) -> None:
    """Fill in the duplicates, the shared shards and the nearest steps of the missing, in place."""
    hashed = [r for r in rows if r["weights_id"] is not None]
    trusted = [r for r in hashed if r["step"] == trusted_step or (r["step"] is None and r["revision"] == "main")]
    trusted_ids = {id(r) for r in trusted}
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in hashed:
        groups[r["weights_id"]].append(r)
    for members in groups.values():
        if len(members) < 2:
            continue
        anchors = [r for r in members if id(r) in trusted_ids]
        anchors.sort(key=lambda r: (r["step"] is None, -(r["step"] or 0)))  # the final step, then main
        for r in members:
            if id(r) in trusted_ids:
                continue
            if anchors:
                other = anchors[0]
            else:
                others = [o for o in members if o is not r]
                other = max(others, key=lambda o: (o["step"] is not None, o["step"] or 0, o["name"]))
            r |= {
                "status": "duplicate",
                "repeats": other["name"],
                "repeats_step": other["step"],
                "note": f"{r['name']}: its weights are byte for byte {other['name']}'s",
            }
    owners: dict[str, set[str]] = defaultdict(set)  # file sha256 -> the names whose weights hold it
    for r in hashed:
        for sha in r["files_sha256"]:
            owners[sha].add(r["name"])
    for r in hashed:
        if r["status"] != "ok" or id(r) in trusted_ids or len(r["files_sha256"]) < 2:
            continue
        shared = [
            (f, owners[sha] - {r["name"]})
            for f, sha in zip(r["weight_files"], r["files_sha256"], strict=True)
            if owners[sha] - {r["name"]}
        ]
        if not shared:
            continue
        files = [f for f, _ in shared]
        others = sorted(set().union(*(o for _, o in shared)))
        listing = by_unit.get((r["repo_id"], r["revision"], r["subfolder"]))
        _, index_name = _weights(r["weight_files"])
        weight_map = read_index(listing, index_name, cache_dir) if listing is not None else {}
        tensors = sorted(t for t, f in weight_map.items() if f in files)
        layers = _layers(tensors)
        what = (
            f"{len(tensors)} tensors" + (f", layers {_span(layers)}" if layers else "")
            if tensors
            else "tensors unknown"
        )
        r |= {
            "status": "partial",
            "shared_files": files,
            "shared_with": others,
            "shared_tensors": tensors,
            "shared_layers": layers,
            "note": f"{r['name']}: {', '.join(files)} ({what}) also served by {', '.join(others)}",
        }
    real = sorted({r["step"] for r in hashed if r["step"] is not None and r["status"] in ("ok", "partial")})
    for r in rows:
        if r["status"] in UNLOADABLE and r["step"] is not None:
            near = nearest_steps(r["step"], real) if real else []
            r["nearest"] = near
            r["note"] += f"; nearest steps with weights: {', '.join(map(str, near)) or 'none'}"


def _reason(row: Mapping[str, Any]) -> str:
    """A row's note without the name it starts with."""
    return (row["note"] or "").removeprefix(f"{row['name']}: ")


def _span(layers: Sequence[int]) -> str:
    """``0-3, 7``: consecutive layers as ranges."""
    out, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------- the table


def grid_path(results: Path | str, family: str, model: str) -> Path:
    return Path(results) / family / model / GRID_FILE


def read_grid(path: Path | str) -> pl.DataFrame | None:
    path = Path(path)
    if not path.is_file():
        return None
    try:
        table = pl.read_parquet(path)
    except Exception:
        return None
    return table if set(GRID_SCHEMA) <= set(table.columns) else None


def write_grid(table: pl.DataFrame, path: Path | str) -> bool:
    """Write the table unless the file already holds it (so that what reads it reruns only when it changed);
    True when written."""
    from anisweep.tables import write_atomic

    old = read_grid(path)
    if old is not None and old.select(list(GRID_SCHEMA)).equals(table.select(list(GRID_SCHEMA))):
        return False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(table, path)
    return True


def steps_with(table: pl.DataFrame, statuses: Iterable[str], steps: Iterable[int]) -> dict[int, dict[str, Any]]:
    """{step: its grid row} of ``steps`` whose status is one of ``statuses``."""
    chosen, statuses = set(steps), set(statuses)
    return {
        r["step"]: r
        for r in table.filter(pl.col("step").is_not_null()).iter_rows(named=True)
        if r["step"] in chosen and r["status"] in statuses
    }


def expected_hashes(table: pl.DataFrame | None, step: int) -> dict[str, str]:
    """{weight file: sha256} the audit found for ``step`` ({} where it has none)."""
    if table is None:
        return {}
    rows = table.filter(pl.col("step") == step).to_dicts()
    if not rows or rows[0]["files_sha256"] is None or any(s is None for s in rows[0]["files_sha256"]):
        return {}
    return dict(zip(rows[0]["weight_files"], rows[0]["files_sha256"], strict=True))


def unchecked_reasons(table: pl.DataFrame, steps: Iterable[int] | None = None) -> dict[str, list[int]]:
    """{why: the steps} of the grid's ``unchecked`` steps (among ``steps``, where given)."""
    chosen = None if steps is None else set(steps)
    out: dict[str, list[int]] = defaultdict(list)
    for r in table.filter((pl.col("status") == "unchecked") & pl.col("step").is_not_null()).iter_rows(named=True):
        if chosen is None or r["step"] in chosen:
            out[_reason(r)].append(r["step"])
    return {why: sorted(found) for why, found in out.items()}


def how_to_check(reasons: Iterable[str]) -> str:
    """What would let the audit check the steps left unchecked for ``reasons``, true to where it ran."""
    reasons = list(reasons)
    fixes = []
    if any(NOT_CACHED in r for r in reasons):
        fixes.append(
            "HF_HUB_OFFLINE is set: unset it where the Hub can be reached and run again"
            if is_offline()
            else "the Hub could not be reached: check the network (or HF_ENDPOINT) and run again"
        )
    if any(NO_SHA256 in r for r in reasons):
        fixes.append(
            "the Hub lists no sha256 for their weight files (they are not stored through LFS): no audit can "
            "compare their bytes with other branches'"
        )
    return "; ".join(fixes)


# ---------------------------------------------------------------------------------------------- the sweep


def _repeats(row: Mapping[str, Any]) -> str | None:
    if row["status"] == "duplicate":
        return row["repeats"]
    if row["status"] == "partial":
        return ", ".join(row["shared_with"] or [])
    return None


def sweep_columns(table: pl.DataFrame) -> pl.DataFrame:
    """Per step of the grid: its audit status (``audit``) and the branch it repeats (``repeats``; for a partial
    duplicate, those that serve its shared shards), to join onto a sweep."""
    rows = [
        {"step": r["step"], "audit": r["status"], "repeats": _repeats(r)}
        for r in table.filter(pl.col("step").is_not_null()).iter_rows(named=True)
    ]
    return pl.DataFrame(rows, schema={"step": pl.Int64, "audit": pl.String, "repeats": pl.String})


def skipped_rows(table: pl.DataFrame, steps: Iterable[int], seed: int | None) -> pl.DataFrame:
    """A sweep's rows for the config's steps the audit left out: one each, with the audit's status as ``status``
    and the step it repeats as ``duplicate_of_step``."""
    rows = [
        {
            "family": r["family"],
            "model": r["model"],
            "seed": seed,
            "step": step,
            "status": r["status"],
            "duplicate_of_step": r["repeats_step"],
            "audit": r["status"],
            "repeats": _repeats(r),
        }
        for step, r in sorted(steps_with(table, SKIPPED, steps).items())
    ]
    schema = {
        "family": pl.String,
        "model": pl.String,
        "seed": pl.Int64,
        "step": pl.Int64,
        "status": pl.String,
        "duplicate_of_step": pl.Int64,
        "audit": pl.String,
        "repeats": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def with_audit(
    sweep: pl.DataFrame, grid_file: str | Path, flagged_steps: Iterable[int] = (), seed: int | None = None
) -> pl.DataFrame:
    """A Hub model's sweep (anisweep.measures.sweep) with the audit of its grid (``grid_file``): each step's audit
    status (``audit``) and the branch it repeats (``repeats``), and one row for each of the config's steps the audit
    left out (``flagged_steps``, whose rows carry ``seed``), its status the audit's. The sweep rule's table and the
    partial one a failed run leaves (anisweep.measures.partial) alike."""
    from anisweep.tables import METRIC_KEY

    grid = read_grid(grid_file)
    if grid is None:
        raise ValueError(f"{grid_file}: not an audit of a grid (anisweep.checkpoints.audit); run `anisweep audit`")
    columns = [*sweep.columns, *AUDIT_COLUMNS]
    sweep = sweep.join(sweep_columns(grid), on="step", how="left")
    sweep = pl.concat([sweep, skipped_rows(grid, flagged_steps, seed)], how="diagonal_relaxed")
    return sweep.select(columns).sort("step", *METRIC_KEY, nulls_last=True)


# ---------------------------------------------------------------------------------------------- reports


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _steps(steps: Sequence[int]) -> str:
    """``steps 0, 1, 2``: the first twelve, then how many in all."""
    shown = ", ".join(map(str, steps[:12]))
    return f"steps {shown}" + (f", ... ({len(steps)} steps)" if len(steps) > 12 else "")


def _others(names: list[str]) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f" (and {len(names)} other branch{'es' if len(names) > 1 else ''}: {shown})"


def health(table: pl.DataFrame, notes: Iterable[str] = (), steps: Iterable[int] | None = None) -> list[str]:
    """A model's grid health in a few lines: counts by status, the bytes a sweep of the whole grid does not download,
    each finding (grouped by the branch repeated), and how it was audited."""
    family, model = table["family"][0], table["model"][0]
    grid = table.filter(pl.col("step").is_not_null())
    counts = grid.group_by("status").len().sort("status")
    lines = [
        f"{family}/{model}: {grid.height} published steps: "
        + ", ".join(f"{n} {s}" for s, n in counts.iter_rows())
        + _others(table.filter(pl.col("step").is_null())["name"].to_list())
    ]
    dup = grid.filter(pl.col("status") == "duplicate")
    if dup.height:
        saved = dup["weights_bytes"].fill_null(0).sum()
        lines.append(f"not downloaded under audit.flagged: skip: {dup.height} duplicate steps, {_size(saved)}")
        for (repeats,), group in dup.group_by(["repeats"], maintain_order=True):
            lines.append(f"  repeat {repeats}: {_steps(group['step'].sort().to_list())}")
    for r in grid.filter(pl.col("status") == "partial").iter_rows(named=True):
        lines.append(f"  partial: {r['note']}")
    for status in UNLOADABLE:
        gone = grid.filter(pl.col("status") == status)
        if 0 < gone.height <= 5:
            lines += [f"  {status}: {r['note']}" for r in gone.iter_rows(named=True)]
        elif gone.height:
            shown = ", ".join(map(str, gone["step"].sort().to_list()[:12]))
            lines.append(f"  {status}: {gone.height} steps ({shown}, ...): see grid.parquet's nearest")
    for why, found in unchecked_reasons(table).items():
        lines.append(f"  unchecked: {_steps(found)}: {why}")
    if steps is not None:
        chosen = steps_with(table, FLAGGED, steps)
        if chosen:
            lines.append(f"swept and flagged: steps {', '.join(map(str, sorted(chosen)))}")
    return lines + [f"note: {n}" for n in notes]
