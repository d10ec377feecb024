"""Checkpoint catalogues: which checkpoints exist, under which names, and how many tokens each has seen.

One small catalogue class per family (the shape of the PyPI ``lm-checkpoints`` package):

* :class:`Pythia` -- ``EleutherAI/pythia-{size}[-deduped|-seed{n}]``, revision ``step{N}``.
* :class:`MultiBERTs` -- ``google/multiberts-seed_{s}-step_{k}k`` (seeds 0-4) and ``google/multiberts-seed_{s}``.
* :class:`OLMo` -- ``allenai/OLMo-1B-hf``, branch ``step{N}-tokens{T}B`` (looked up by N at fetch).
* :class:`OLMo2` -- ``allenai/OLMo-2-0425-1B``, branch ``stage1-step{N}-tokens{T}B`` (looked up by N at fetch).
* :class:`MistralGPT2` -- ``stanford-crfm/{run}-gpt2-{small,medium}-x{seed}``, branch ``checkpoint-{N}``.
* :class:`TinyLlama` -- seven ``TinyLlama-1.1B-intermediate-step-*`` repositories, revision ``main``.
* :class:`HubRepo` -- any other Hub repository (``family: hub``): its default revision, or its checkpoints kept as
  branches or folders named by a pattern with ``{step}`` (anisweep.checkpoints.hub_repo).
* :class:`LocalRun` -- a user's own training run: ``step{N}/`` or Trainer-style ``checkpoint-{N}/`` subfolders.
* :class:`Toy` -- the toy models the pipeline trains itself, under ``toy_root/{name}/step{N}/``.

A model entry of the config (``{family, name, steps, ...}``) becomes a list of :class:`Checkpoint` through
:func:`resolve`; :func:`resolve_all` does a whole ``models`` list. Every mistake (unknown family, size,
seed, step, key) fails here, before any download, with a :class:`ConfigError` that names the offending
value and the nearest valid ones.

Decisions (also in the class docstrings):

* ``step`` is always the integer optimizer step. MultiBERTs ``step_20k`` is step 20000.
* MultiBERTs step 2,000,000 of seeds 0-4 is the ``-step_2000k`` repo, so that a sweep (``all``, a list or a
  range) stays inside one release (the intermediate checkpoints). ``steps: final`` selects the separately
  published final model ``google/multiberts-seed_{s}`` (also step 2,000,000); seeds 5-24 only have that one.
* Pythia seed variants are the PolyPythias runs ``pythia-{14m,31m,70m,160m,410m}-seed{1..9}``. Their ``seed``
  is n; the original Pythia models (and ``-deduped``) record ``seed=1234``, the seed the PolyPythias model
  cards give for them.
* A local run without ``tokens_per_step`` in its entry gets ``tokens_seen`` from the checkpoint's
  ``trainer_state.json`` (``num_input_tokens_seen``, when the Trainer counted it), else ``None`` (a null in
  the Parquet tables): unknown, never a made-up number.
* Step selection: ``all`` (the whole published grid), ``final`` (its last step), one int, a list of ints
  (each must exist), or a range ``{start, stop, every}`` (stop inclusive) that selects the grid steps s with
  ``start <= s <= stop`` and ``(s - start) % every == 0`` (``every`` defaults to 1: every grid step in the
  range). A range that selects nothing is an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from anisweep.checkpoints.base import Checkpoint, listing, nearest_names
from anisweep.checkpoints.hub import MistralGPT2, MultiBERTs, OLMo, OLMo2, Pythia, TinyLlama
from anisweep.checkpoints.hub_repo import HubRepo
from anisweep.checkpoints.local import LocalRun
from anisweep.checkpoints.preflight import ModelShape, folder_shape
from anisweep.checkpoints.toy import Toy
from anisweep.errors import ConfigError

# The registry: every family class carries its own facts (entry keys, resolution, the trusted final step,
# its size for resource requests). A new checkpoint suite is one class here and one line in FAMILIES.
FAMILIES: dict[str, type] = {
    cls.family: cls for cls in (Pythia, MultiBERTs, OLMo, OLMo2, MistralGPT2, TinyLlama, HubRepo, LocalRun, Toy)
}


#: Keys every family's entry may hold, besides its own `entry_keys`: what later stages read (the survey figures' group).
COMMON_ENTRY_KEYS = ("group",)
_ALL_KEYS = sorted({k for cls in FAMILIES.values() for k in cls.entry_keys})


def family_of(name: Any) -> type:
    """The catalogue class of a family name; a ConfigError names the nearest known ones."""
    if name not in FAMILIES:
        raise ConfigError(
            f"family {name!r} is unknown; nearest: {listing(nearest_names(str(name), FAMILIES, 2))}"
            f" (families: {listing(FAMILIES)})"
        )
    return FAMILIES[name]


def tokens_per_step(family: str) -> int | None:
    """Tokens per optimizer step of a Hub family; ``None`` for local/toy (they depend on the run)."""
    return family_of(family).tokens_per_step


def _check_keys(entry: Mapping[str, Any], cls: type, name: str) -> None:
    valid = (*cls.entry_keys, *COMMON_ENTRY_KEYS)
    for key in entry:
        if key in valid:
            continue
        # Keys meant for this file (a typo such as 'step', or tokens_per_step on a Hub family) are errors;
        # other keys belong to later stages of the pipeline and are left to the config schema.
        if key in _ALL_KEYS:
            raise ConfigError(
                f"key {key!r} is not used for family {cls.family} (entry {name!r}); valid keys: {listing(valid)}"
                + (f"; tokens per step is fixed at {cls.tokens_per_step}" if key == "tokens_per_step" else "")
            )
        near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.75)
        if near:
            raise ConfigError(
                f"key {key!r} of {cls.family} entry {name!r} is unknown; nearest: {near[0]}"
                f" (valid keys: {listing(valid)})"
            )


def resolve(
    entry: Mapping[str, Any], toy_root: Path | None = None, toy_specs: Mapping[str, Any] | None = None
) -> list[Checkpoint]:
    """Expand one ``models`` entry of the config into its checkpoints (validated, sorted by step)."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"a models entry must be a mapping with family, name, steps; got {entry!r}")
    cls = family_of(entry.get("family"))
    name = entry.get("name")
    if name is None:
        raise ConfigError(f"a {cls.family} entry needs a 'name'")
    _check_keys(entry, cls, str(name))
    return cls.resolve_entry({**entry, "name": str(name)}, toy_root=toy_root, toy_specs=toy_specs)


def resolve_all(
    models: Iterable[Mapping[str, Any]],
    toy_root: Path | None = None,
    toy_specs: Mapping[str, Any] | None = None,
) -> list[Checkpoint]:
    """Every checkpoint of a config's ``models`` list, in config order, each ``key`` once.

    The same Hub checkpoint listed twice is kept once (two entries of one Hub model select from one published
    grid); two different checkpoints under one key (e.g. the MultiBERTs ``-step_2000k`` repo and the ``final``
    repo of one seed, or two local runs of one name) are a :class:`ConfigError`: their results would land in the
    same folder. A toy or a local run (``one_entry_per_model``) named by two entries is a ConfigError too, naming
    both: a local name may stand for two runs, and one entry with all the steps says what is swept.
    """
    seen: dict[str, Checkpoint] = {}
    entries: dict[tuple[str, str], _Entry] = {}
    for index, entry in enumerate(models or ()):
        found = resolve(entry, toy_root=toy_root, toy_specs=toy_specs)
        for ckpt in found:
            old = seen.get(ckpt.key)
            if old is not None and old != ckpt:
                raise ConfigError(
                    f"{ckpt.key} is listed twice with different sources: {_source(old)} and {_source(ckpt)};"
                    " give one of the entries another name"
                )
            seen.setdefault(ckpt.key, ckpt)
        if getattr(family_of(entry["family"]), "one_entry_per_model", False):
            model = (str(entry["family"]), str(entry["name"]))
            if model in entries:
                _two_entries(entries[model], (index, entry, found))
            entries[model] = (index, entry, found)
    return list(seen.values())


_Entry = tuple[int, Mapping[str, Any], list[Checkpoint]]  # a models entry: its index, itself, its checkpoints


def _two_entries(first: _Entry, second: _Entry) -> None:
    """The ConfigError for two entries of one toy or local run: one entry with the union of their steps, or,
    where they differ in more than their steps, another name for one of them."""
    (i, a, found_a), (j, b, found_b) = first, second
    what = f"{a['family']} model {a['name']!r}"
    shown = f"models[{i}] {dict(a)} and models[{j}] {dict(b)}"
    others = {k: v for k, v in a.items() if k != "steps"} != {k: v for k, v in b.items() if k != "steps"}
    if others:
        raise ConfigError(
            f"two entries name the {what}, with different settings: {shown}; their steps would be merged into "
            "one sweep. If they are two runs, give one entry another name; if one, write one entry"
        )
    steps = sorted({c.step for c in found_a} | {c.step for c in found_b})
    raise ConfigError(
        f"two entries name the {what}: {shown}; a model is one entry (its steps would be merged without a word): "
        f"write one entry with the union of their steps, steps: {steps}"
    )


def _source(ckpt: Checkpoint) -> str:
    where = ckpt.repo_id or ckpt.path
    if ckpt.family == "hub":
        where = f"{where}@{ckpt.revision}" + (f"/{ckpt.subfolder}" if ckpt.subfolder else "")
    return where if ckpt.tokenizer is None else f"{where} (tokenizer {ckpt.tokenizer})"


def final_step(checkpoints: Sequence[Checkpoint]) -> int:
    """The step whose weights are trusted when several steps of one model share them: the published final
    model for Hub families (Pythia's defective branches serve it under earlier names), else the last step."""
    return family_of(checkpoints[0].family).trusted_step([c.step for c in checkpoints])


def params_millions(ckpt: Checkpoint) -> float:
    """About how many million parameters a checkpoint has, for memory and time requests."""
    return family_of(ckpt.family).params_millions(ckpt)


def model_shape(ckpt: Checkpoint) -> ModelShape | None:
    """A checkpoint's width, blocks and heads as far as they are known before it is fetched: a Hub family's from its
    catalogue, a local run's from its config.json; None otherwise (a toy's are its spec's, anisweep.config)."""
    if ckpt.family == HubRepo.family:
        return HubRepo.shape_of_checkpoint(ckpt)  # from config.json when the cache holds it
    shape = getattr(family_of(ckpt.family), "shape", None)
    if shape is not None:
        return shape(ckpt.model)
    return folder_shape(ckpt.path) if ckpt.family == "local" and ckpt.path else None
