"""The pipeline config as the package reads it: validated against the schema, defaults filled in, models
expanded into checkpoints. Importing this module imports neither torch nor the model code, so that a dry
run of the workflow stays fast.

`config.schema.yaml` beside this file is the one home of every key, default and meaning; config/README.md's table
of each section's keys is generated from it (a test keeps them equal), rewrite them with

    python -m anisweep.config            # rewrites config/README.md (run from the repository root)
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.catalogue import model_shape, resolve_all
from anisweep.checkpoints.config_checks import check_models, check_sections
from anisweep.checkpoints.preflight import ModelShape, PreflightError, check_model_config
from anisweep.errors import ConfigError
from anisweep.schema import SCHEMA_PATH, defaults, schema

TOY_ROOT = "resources/toy"


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


_TYPES = {"array": "a list", "object": "a mapping", "integer": "an integer", "string": "a string", "null": "null"}
_MISMATCH = ("type", "enum", "const")


def _keys(names) -> str:
    return "[" + ", ".join(sorted(names)) + "]"


def _form(node: dict) -> str:
    """What one alternative of a oneOf/anyOf accepts, in a few words."""
    if "$ref" in node:
        node = schema()["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    if "enum" in node or "const" in node:
        return "one of [" + ", ".join(map(str, node.get("enum", [node.get("const")]))) + "]"
    if "oneOf" in node or "anyOf" in node:
        return " or ".join(_form(n) for n in node.get("oneOf", node.get("anyOf")))
    if node.get("type") == "object" and "properties" in node:
        required = node.get("required", [])
        need = f" ({', '.join(required)} required)" if required else ""
        return f"a mapping with keys {_keys(node['properties'])}{need}"
    types = node.get("type", [])
    return " or ".join(_TYPES.get(t, f"a {t}") for t in ([types] if isinstance(types, str) else types)) or "a value"


def _fits(error) -> bool:
    """Whether a oneOf/anyOf alternative's error is about the value's content, not its being of another form."""
    if error.validator in ("oneOf", "anyOf"):
        return any(_fits(sub) for sub in error.context)
    return error.validator not in _MISMATCH


def _explain(error) -> tuple[str, str]:
    """(where, what) of a schema error. A oneOf/anyOf error is explained by the alternative of the value's own
    form (a mapping's unknown key, with the allowed ones), else by the forms the value may take; an unknown key
    names the allowed ones."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        branches: dict[int, list] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        fitting = [subs for subs in branches.values() if all(_fits(sub) for sub in subs)]
        if fitting:
            subs = min(fitting, key=len)
            unknown = [sub for sub in subs if sub.validator == "additionalProperties"]
            return _explain(unknown[0] if unknown else subs[0])
        forms = " or ".join(_form(node) for node in error.validator_value)
        return _where(error), f"{error.instance!r} is none of the forms allowed here: {forms}"
    if error.validator == "additionalProperties" and isinstance(error.schema.get("properties"), dict):
        return _where(error), f"{error.message}; allowed keys: {_keys(error.schema['properties'])}"
    return _where(error), error.message


def complete(config: dict) -> dict:
    """A copy of `config` validated against the schema (a ConfigError names the key and what is wrong) with
    every default filled in: a section whose keys all default may be left out. Then the checks the schema
    cannot make (anisweep.checkpoints.config_checks.check_sections)."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(config))
    if error is not None:
        while error.parent is not None and error.parent.validator in ("oneOf", "anyOf"):
            error = error.parent  # best_match may stop inside an alternative: explain from the choice itself
        where, what = _explain(error)
        raise ConfigError(f"{where}: {what}")
    config = copy.deepcopy(config)
    _fill_defaults(schema(), config)
    check_sections(config)
    return config


def load(path: str | Path) -> dict:
    """A config file, validated and completed."""
    text = Path(path).read_text()
    return complete(yaml.safe_load(text) or {})


def toy_spec(config: dict, name: str) -> dict:
    """A toy model's entry with every default filled in (arch, seed, steps and the ToySpec fields)."""
    return {**defaults("toy"), **config.get("toy", {}).get(name, {})}


def checkpoints(config: dict) -> list[Checkpoint]:
    """Every checkpoint the config's `models` list names, each once, validated (raises errors.ConfigError;
    the same checkpoint named twice with different sources among them)."""
    toy_specs = {name: toy_spec(config, name) for name in config.get("toy", {})}
    found = resolve_all(config.get("models", []), toy_root=Path(TOY_ROOT), toy_specs=toy_specs)
    for name in dict.fromkeys(c.model for c in found if c.family == "toy"):
        _check_toy_fits(name, toy_specs[name], config.get("extract", {}))
    _check_live_toys([name for name, spec in toy_specs.items() if spec.get("live")], config)
    _check_live_local(found, config)
    steps = config.get("gradients", {}).get("steps")
    analysed = dict.fromkeys(f"{c.family}/{c.model}" for c in found if steps is None or c.step in steps)
    check_models(config, _shapes(found, toy_specs), list(analysed))
    return found


def _shapes(found: list[Checkpoint], toy_specs: dict[str, dict]) -> dict[str, ModelShape | None]:
    """Each model's shape by "family/model": a toy's from its spec, else as the catalogue knows it before a fetch."""
    shapes: dict[str, ModelShape | None] = {}
    for c in found:
        key = f"{c.family}/{c.model}"
        if key not in shapes:
            spec = toy_specs[c.model] if c.family == "toy" else None
            shapes[key] = ModelShape(spec["d_model"], spec["n_layers"], spec["n_heads"]) if spec else model_shape(c)
    return shapes


def live_local_runs(config: dict) -> dict[str, Path]:
    """The local runs analysed while they trained (`live: true`), by name: the folder their step{N}/ are in."""
    from anisweep.checkpoints.local import run_folder

    return {
        str(e["name"]): run_folder(e)
        for e in config.get("models", [])
        if isinstance(e, dict) and e.get("family") == "local" and e.get("live")
    }


def _check_live_local(found: list[Checkpoint], config: dict) -> None:
    """A live local run has no weights (as a live toy has none) and, where the gradient analysis covers its
    steps, needs the backward pass's tables (gradient_sums.parquet, ...) the callback wrote at each."""
    from anisweep.checkpoints.local import check_live_settings, missing_gradients

    live = list(live_local_runs(config))
    _check_live_toys(live, config, "live local runs", "sweep the run's saved checkpoints (live: false)")
    check_live_settings([c for c in found if c.family == "local" and c.model in live], config.get("extract"))
    gradients = config.get("gradients", {})
    if not live or not gradients.get("enabled"):
        return
    names = ["gradient_sums.parquet", "gradient_sample.parquet"]
    names += ["embedding_rows.parquet"] if gradients.get("embedding_change") else []
    found_live = [c for c in found if c.family == "local" and c.model in live]
    missing = missing_gradients(found_live, gradients.get("steps"), names)
    if missing:
        raise ConfigError(
            f"live local runs: gradients.enabled, but {', '.join(map(str, missing))} lack one of {', '.join(names)} "
            "(the callback ran with gradients disabled there, or without embedding_change); run AnisweepCallback "
            "with the config's gradient analysis at these steps, leave them out of gradients.steps, or set "
            "gradients.enabled: false"
        )


def _check_live_toys(
    live: list[str], config: dict, what: str = "live toys", instead: str = "train these toys with live: false"
) -> None:
    """What needs a toy's saved weights cannot run on a live toy (nor on another model without weights: `what`
    names them, `instead` says what to do): the untrained block's inits. The gradient analysis, fixed subspaces
    and embedding change included, reads the tables written while it trained."""
    if not live:
        return
    untrained = config.get("untrained", {})
    inits = untrained.get("inits", []) if untrained.get("enabled") else []
    named = sorted({i["model"] for i in inits if isinstance(i, dict) and i.get("model") in live})
    if named:
        raise ConfigError(
            f"untrained.inits names {what} {named}, which save no checkpoint to build the block from; "
            "name a saved model, or " + instead
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


def groups(config: dict) -> dict[str, str]:
    """{"family/model": group} of the models entries that name a `group` (the survey figures' panels), the model
    named as its results folder is."""
    from anisweep.checkpoints.hub_repo import HubRepo

    found = {}
    for entry in config.get("models", []):
        if entry.get("group"):
            model = HubRepo.repo_and_model(entry)[1] if entry["family"] == "hub" else str(entry["name"])
            found[f"{entry['family']}/{model}"] = entry["group"]
    return found


def describe(config: dict) -> list[dict[str, Any]]:
    return [c.to_dict() for c in checkpoints(complete(config))]


#: config/README.md: a section's generated table lies between these lines, the first naming the section
GENERATED = re.compile(
    r"^(<!-- (\w+): generated from src/anisweep/config\.schema\.yaml by python -m anisweep\.config -->\n)"
    r".*?^(<!-- end of generated table -->)$",
    re.M | re.S,
)


def documented_sections() -> list[str]:
    """The sections with a key that has a default: config/README.md has a generated table of each."""
    sections = schema()["properties"]
    return [name for name in sections if (name == "toy" or sections[name].get("type") == "object") and defaults(name)]


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).splitlines()[0]


def section_table(section: str) -> str:
    """The markdown table of a section's keys (for `toy`, of one toy's entry): each one's default, as YAML, and its
    description."""
    node = schema()["properties"][section]
    node = node["additionalProperties"] if section == "toy" else node
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, p in node["properties"].items():
        if "description" not in p:
            raise ValueError(f"{SCHEMA_PATH.name}: {section}.{key} has no description")
        default = f"`{_yaml(p['default'])}`" if "default" in p else ""
        if key in node.get("required", []):
            default = "required"
        meaning = p["description"].replace("|", r"\|")  # a bare bar would end the cell
        lines.append(f"| `{key}` | {default} | {meaning} |")
    return "\n".join(lines)


def readme(text: str) -> str:
    """`text` (config/README.md) with each generated table rewritten from the schema."""
    return GENERATED.sub(lambda m: f"{m[1]}{section_table(m[2])}\n{m[3]}", text)


def generated_sections(text: str) -> list[str]:
    return [m[2] for m in GENERATED.finditer(text)]


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "config/README.md")
    path.write_text(readme(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(path)
