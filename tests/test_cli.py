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
