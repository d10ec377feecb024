"""Which initialisation the untrained block has (config `untrained.inits`): a block built from a config by
transformers (`bert`, `gpt_neox`: the library's `_init_weights`), or a swept model's earliest checkpoint, whose
real initialisation the sweep already fetches (`{model: toy-bert}`: its step 0 where step 0 is swept).

No torch here: the workflow resolves the inits against the config's checkpoints when it is parsed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from anisweep.checkpoints.base import Checkpoint
from anisweep.errors import ConfigError

CONFIG_INITS = ("bert", "gpt_neox")
#: The architectures (config.json's model_type) whose first block runs alone here. The Llama-style ones (llama,
#: olmo, olmo2) do not yet: their adapters lack the rotary module a block alone needs (Adapter.rotary_embedding).
BLOCK_MODEL_TYPES = ("bert", "gpt_neox", "gpt2")
#: The catalogue families of the others, with their architecture.
OTHER_FAMILIES = {"tinyllama": "llama", "olmo": "olmo", "olmo2": "olmo2"}
SUPPORTED = "pythia, multiberts, gpt2 and toy models, or a local run of model_type " + ", ".join(BLOCK_MODEL_TYPES)


def is_checkpoint_init(init) -> bool:
    return isinstance(init, dict)


def label(init) -> str:
    """The `init` column of the tables and the figures' titles: `bert`, or `toy-bert@step0`."""
    if not is_checkpoint_init(init):
        return init
    if init.get("step") is None:
        raise ValueError(
            f"untrained.inits: {init} has no step; give `step: N` "
            "(the workflow fills in the model's earliest swept step)"
        )
    return f"{init['model']}@step{init['step']}"


def weights_key(init: dict) -> str:
    """`{family}/{model}/step{N}`: where the fetch rule puts its weights, under weights/."""
    return f"{init['family']}/{init['model']}/step{init['step']}"


def resolve(inits: list, checkpoints: Iterable[Checkpoint]) -> list:
    """`inits` with each checkpoint init completed to {family, model, step} from the config's checkpoints: the
    model must be a `models` entry (with `family` when two families have a model of that name); `step` defaults
    to the model's earliest swept step and must be one of them. Raises ConfigError naming what to change."""
    swept: dict[tuple[str, str], list[int]] = {}
    paths: dict[tuple[str, str, int], str | None] = {}
    for c in checkpoints:
        swept.setdefault((c.family, c.model), []).append(c.step)
        paths[(c.family, c.model, c.step)] = getattr(c, "path", None)
    resolved = []
    for init in inits:
        if not is_checkpoint_init(init):
            resolved.append(init)
            continue
        name, family = init["model"], init.get("family")
        matches = [key for key in swept if key[1] == name and family in (None, key[0])]
        if not matches:
            known = ", ".join(f"{f}/{m}" for f, m in swept)
            raise ConfigError(
                f"untrained.inits: {init} is not a model of this config's `models` ({known}); "
                "name one of them, or add the model to `models`"
            )
        if len(matches) > 1:
            raise ConfigError(
                f"untrained.inits: {init}: {name} is a model of several families "
                f"({', '.join(f for f, _ in matches)}); add `family:`"
            )
        key = matches[0]
        steps = sorted(swept[key])
        step = init.get("step", steps[0])
        if step not in steps:
            raise ConfigError(
                f"untrained.inits: {init}: step {step} is not a swept step of {key[0]}/{name} "
                f"(its earliest is {steps[0]}); leave `step` out for the earliest, or add step {step} to its steps"
            )
        _check_architecture(init, key[0], paths.get((*key, step)))
        resolved.append({"family": key[0], "model": name, "step": step})
    labels = [label(i) for i in resolved]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ConfigError(f"untrained.inits: {repeated} named twice; name each init once")
    return resolved


def _check_architecture(init: dict, family: str, path: str | None) -> None:
    """A checkpoint init whose architecture cannot run its first block alone is an error now, before its weights
    are fetched (GBs for the Hub's 1B models)."""
    arch = OTHER_FAMILIES.get(family)
    if family == "local" and path:
        try:
            arch = json.loads((Path(path) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            arch = None  # fetch reports an unreadable config.json
        arch = None if arch in BLOCK_MODEL_TYPES else arch
    if arch is not None:
        raise ConfigError(
            f"untrained.inits: {init}: {family}/{init['model']} is a {arch} model, whose first block the untrained "
            f"experiment cannot run alone yet (its adapter has no rotary module for it); name one of {SUPPORTED}, "
            f"or a config-built init ({', '.join(CONFIG_INITS)})"
        )
