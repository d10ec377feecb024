"""The types of the command line's arguments, shared by the stages' commands (argparse's `type=`)."""

from __future__ import annotations

import argparse
import json


def json_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text[:200]}") from None


def step_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integer steps, got {text!r}") from None
