"""The pipeline config as the package reads it: defaults filled in, models expanded into checkpoints."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .extract import ExtractSettings
from .sources import PYTHIA_STEPS, Checkpoint, MultiBERTs, resolve
from .toy import ToySpec

TOY_ROOT = "resources/toy"
TOY_ARCHS = ("bert", "gpt_neox")


def toy_spec(config: dict, name: str) -> dict:
    """A toy model's entry with every ToySpec default filled in (arch, seed, steps and the spec fields)."""
    entry = dict(config.get("toy", {}).get(name, {}))
    fields = {f.name: f.default for f in dataclasses.fields(ToySpec)}
    return {"seed": 0, **fields, **entry}


def checkpoints(config: dict) -> list[Checkpoint]:
    """Every checkpoint the config's `models` list names, validated (raises sources.ConfigError)."""
    toy_specs = {name: toy_spec(config, name) for name in config.get("toy", {})}
    found = []
    for entry in config.get("models", []):
        found += resolve(entry, toy_root=Path(TOY_ROOT), toy_specs=toy_specs)
    return found


def final_step(family: str, model: str, steps: list[int]) -> int:
    """The step whose weights are trusted when several steps share them: the published final model
    (Pythia's defective branches serve it under earlier names), else the last step the config names."""
    if family == "pythia":
        return PYTHIA_STEPS[-1]
    if family == "multiberts":
        return MultiBERTs.final_step
    return max(steps)


def extract_settings(config: dict) -> ExtractSettings:
    return ExtractSettings(**config.get("extract", {}))


def models(config: dict) -> list[tuple[str, str]]:
    """(family, model) pairs in config order, without repeats."""
    seen: dict[tuple[str, str], None] = {}
    for checkpoint in checkpoints(config):
        seen.setdefault((checkpoint.family, checkpoint.model), None)
    return list(seen)


def describe(config: dict) -> list[dict[str, Any]]:
    return [c.to_dict() for c in checkpoints(config)]
