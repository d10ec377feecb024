"""The config's schema (`config.schema.yaml` beside this file, the one home of every key, default and meaning) and
its defaults, for the settings classes of every stage; anisweep.config validates and completes a whole config.

config/README.md's table of each section's keys is generated from the schema (a test keeps them equal); rewrite
them with

    python -m anisweep.schema            # rewrites config/README.md (run from the repository root)
"""

from __future__ import annotations

import copy
import functools
import re
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")

#: config/README.md: a section's table lies between these lines, the first naming the section
GENERATED = re.compile(
    r"^(<!-- (\w+): generated from src/anisweep/config\.schema\.yaml by python -m anisweep\.schema -->\n)"
    r".*?^(<!-- end of generated table -->)$",
    re.M | re.S,
)


@functools.cache
def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _section(section: str) -> dict:
    """A section's node, for `toy` that of one toy model's entry."""
    node = schema()["properties"][section]
    return node["additionalProperties"] if section == "toy" else node


def defaults(section: str) -> dict[str, Any]:
    """The schema's default of every key of a section (`extract`, `fetch`, `resources`, `corpus`, or `toy`
    for one toy model's entry)."""
    properties = _section(section)["properties"]
    return {key: copy.deepcopy(p["default"]) for key, p in properties.items() if "default" in p}


def documented_sections() -> list[str]:
    """The sections with a key that has a default: config/README.md has a generated table of each."""
    return [
        name
        for name, node in schema()["properties"].items()
        if (name == "toy" or node.get("type") == "object") and defaults(name)
    ]


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).splitlines()[0]


def section_table(section: str) -> str:
    """The markdown table of a section's keys: each one's default (as YAML) and its description."""
    node = _section(section)
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


def document(text: str) -> str:
    """`text` (config/README.md) with each generated table rewritten from the schema."""
    return GENERATED.sub(lambda m: f"{m[1]}{section_table(m[2])}\n{m[3]}", text)


def generated_sections(text: str) -> list[str]:
    return [m[2] for m in GENERATED.finditer(text)]


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "config/README.md")
    path.write_text(document(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(path)
