"""The config's schema (`config.schema.yaml` beside this file, the one home of every key and default) and its
defaults, for the settings classes of every stage; anisweep.config validates and completes a whole config.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


# libyaml's safe loader where PyYAML was built with it: 0.01 s against 0.15 s for the pure-Python one, at every start
# of Snakemake and of a job; the same document either way
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def schema() -> dict:
    return yaml.load(SCHEMA_PATH.read_text(), Loader=SAFE_LOADER)


def defaults(section: str) -> dict[str, Any]:
    """The schema's default of every key of a section (`extract`, `fetch`, `resources`, `corpus`, or `toy`
    for one toy model's entry)."""
    properties = schema()["properties"][section]
    if section == "toy":
        properties = properties["additionalProperties"]
    return {key: copy.deepcopy(p["default"]) for key, p in properties["properties"].items() if "default" in p}
