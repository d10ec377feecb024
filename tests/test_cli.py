"""The command line: every command a rule calls exists, and `anisweep --help` lists every command."""

from __future__ import annotations

import re
from pathlib import Path

from anisweep.cli import parser

ROOT = Path(__file__).resolve().parents[1]


def commands() -> set[str]:
    sub = next(a for a in parser()._actions if a.dest == "command")
    return set(sub.choices)


def test_every_command_a_rule_calls_exists():
    called = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        called |= set(re.findall(r"\{params\.cli\} ([a-z-]+)", smk.read_text()))
    assert called, "no rule calls the CLI"
    assert called <= commands()


def test_help_lists_every_command(capsys):
    help_text = parser().format_help()
    missing = sorted(c for c in commands() if not re.search(rf"^\s+{re.escape(c)}\s", help_text, re.M))
    assert not missing


def test_help_and_parsing_import_no_torch():
    """Each stage's commands import what they run when they run: the parser alone loads no heavy library."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys; from anisweep.cli import parser; top = parser(); top.format_help(); "
        "sub = next(a for a in top._actions if a.dest == 'command'); [p.format_help() for p in sub.choices.values()]; "
        "top.parse_args(['extract', '--manifest', 'm.json', '--out', 'o', '--settings', '{}']); "
        "top.parse_args(['weights', '--checkpoint', '{}', '--out', 'o']); "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert not {"torch", "transformers", "numpy", "polars", "matplotlib"} & set(loaded)


def test_each_command_is_in_its_stages_module_of_the_command_line():
    sub = next(a for a in parser()._actions if a.dest == "command")
    modules = {name: p.get_default("run").__module__ for name, p in sub.choices.items()}
    assert modules["fetch"] == "anisweep.cli.checkpoints"
    assert modules["extract"] == "anisweep.cli.extract"
    assert modules["metrics"] == "anisweep.cli.measures"
    assert all(m.startswith("anisweep.cli.") for m in modules.values()), modules
