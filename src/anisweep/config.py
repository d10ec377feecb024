"""The pipeline config as the package reads it: validated against the schema, defaults filled in, models
expanded into checkpoints. Importing this module imports neither torch nor the model code, so that a dry
run of the workflow stays fast.

`config.schema.yaml` beside this file is the one home of every key and default; `config/README.md` explains them.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from .preflight import PreflightError, check_model_config
from .sources import Checkpoint, ConfigError, resolve_all

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")
TOY_ROOT = "resources/toy"


@functools.cache
def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def defaults(section: str) -> dict[str, Any]:
    """The schema's default of every key of a section (`extract`, `fetch`, `resources`, `corpus`, or `toy`
    for one toy model's entry)."""
    properties = schema()["properties"][section]
    if section == "toy":
        properties = properties["additionalProperties"]
    return {key: copy.deepcopy(p["default"]) for key, p in properties["properties"].items() if "default" in p}


def _fill_defaults(node: dict, instance: Any) -> None:
    if not isinstance(instance, dict):
        return
    for key, sub in node.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(sub, instance[key])
    if isinstance(node.get("additionalProperties"), dict):
        for key in set(instance) - set(node.get("properties", {})):
            _fill_defaults(node["additionalProperties"], instance[key])


def _where(error) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "the config"


def complete(config: dict) -> dict:
    """A copy of `config` validated against the schema (a ConfigError names the key and what is wrong) with
    every default filled in: a section whose keys all default may be left out."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(config))
    if error is not None:
        raise ConfigError(f"{_where(error)}: {error.message}")
    config = copy.deepcopy(config)
    _fill_defaults(schema(), config)
    return config


def load(path: str | Path) -> dict:
    """A config file, validated and completed."""
    text = Path(path).read_text()
    return complete(yaml.safe_load(text) or {})


def toy_spec(config: dict, name: str) -> dict:
    """A toy model's entry with every default filled in (arch, seed, steps and the ToySpec fields)."""
    return {**defaults("toy"), **config.get("toy", {}).get(name, {})}


def checkpoints(config: dict) -> list[Checkpoint]:
    """Every checkpoint the config's `models` list names, each once, validated (raises sources.ConfigError;
    the same checkpoint named twice with different sources among them)."""
    toy_specs = {name: toy_spec(config, name) for name in config.get("toy", {})}
    found = resolve_all(config.get("models", []), toy_root=Path(TOY_ROOT), toy_specs=toy_specs)
    for name in dict.fromkeys(c.model for c in found if c.family == "toy"):
        _check_toy_fits(name, toy_specs[name], config.get("extract", {}))
    _check_live_toys([name for name, spec in toy_specs.items() if spec.get("live")], config)
    return found


def _check_live_toys(live: list[str], config: dict) -> None:
    """What needs a toy's saved weights, or its activations after training, cannot run on a live toy."""
    if not live:
        return
    gradients, untrained = config.get("gradients", {}), config.get("untrained", {})
    if gradients.get("enabled"):
        if gradients.get("subspaces", "per_checkpoint") != "per_checkpoint":
            raise ConfigError(
                f"live toys {live}: gradients.subspaces: {gradients['subspaces']} fits subspaces on steps after "
                "the gradients were taken, which a live toy no longer has; set gradients.subspaces: "
                "per_checkpoint, or train these toys with live: false"
            )
        if gradients.get("embedding_change"):
            raise ConfigError(
                f"live toys {live}: gradients.embedding_change reads each step's saved embedding table; set "
                "gradients.embedding_change: false, or train these toys with live: false"
            )
    inits = untrained.get("inits", []) if untrained.get("enabled") else []
    named = sorted({i["model"] for i in inits if isinstance(i, dict) and i.get("model") in live})
    if named:
        raise ConfigError(
            f"untrained.inits names live toys {named}, which save no checkpoint to build the block from; "
            "name a saved model, or train these toys with live: false"
        )


def _check_toy_fits(name: str, spec: dict, extract: dict) -> None:
    """The checks preflight makes of a downloaded model's config.json, made of a toy before it is trained."""
    positions = spec["max_position_embeddings"] or spec["seq_len"]
    model = {"max_position_embeddings": positions, "hidden_size": spec["d_model"]}
    try:
        check_model_config(model, SimpleNamespace(**{**defaults("extract"), **extract}), f"toy model {name}")
    except PreflightError as error:
        raise ConfigError(f"{error} (or change toy.{name})") from None


def models(config: dict) -> list[tuple[str, str]]:
    """(family, model) pairs in config order, without repeats."""
    return list(dict.fromkeys((c.family, c.model) for c in checkpoints(config)))


def describe(config: dict) -> list[dict[str, Any]]:
    return [c.to_dict() for c in checkpoints(complete(config))]
