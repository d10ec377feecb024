"""The goal: every line of it (the device table's goals, the comparison, the kernel tests, the call's wall time)
with its measured value and verdict, and all of them together."""

from __future__ import annotations

from .compare import comparison_line
from .core import FAIL, NOT_RUN, PASS, cell_text, combine, fmt_x
from .device import DEFAULT_GOAL, MAX_MEMORY_RATIO, cell_checks, cell_label, speed_goal
from .kernel_tests import kernel_tests_line

TIME_GOAL_S = 600


def criterion_line(goal: str, rows: list[dict], name: str) -> dict:
    checks = [(row, cell_checks(row)[name]) for row in rows]
    return {
        "goal": goal,
        "measured": ", ".join(f"{cell_label(row)} {fmt_x(value)}" for row, (value, _) in checks) or "not run",
        "verdict": combine(verdict for _, (_, verdict) in checks),
    }


def goal_lines(out: dict) -> list[dict]:
    """Every line of the goal: its measured values and verdict (PASS, FAIL, NOT_RUN), then all of them."""
    rows = out.get("device_rows") or []
    lines = [
        criterion_line(
            f"extract >= {goal}x the tokens/s of a plain sdpa forward",
            [r for r in rows if speed_goal(r) == goal],
            "speed",
        )
        for goal in sorted({speed_goal(r) for r in rows} or {DEFAULT_GOAL}, reverse=True)
    ]
    lines += [
        criterion_line(f"peak device memory <= {MAX_MEMORY_RATIO}x the plain pass's", rows, "memory"),
        criterion_line("extract ahead of HF keep-all (tokens/s), every cell", rows, "vs_hf"),
        comparison_line(out.get("comparison")),
        kernel_tests_line(out.get("kernel_tests")),
    ]
    wall = (out.get("call") or {}).get("wall_s")
    lines.append(
        {
            "goal": f"one call under {TIME_GOAL_S // 60} minutes",
            "measured": "-" if wall is None else f"{wall:.0f} s, parts {' '.join(out['call']['parts'])}",
            "verdict": NOT_RUN if wall is None else PASS if wall < TIME_GOAL_S else FAIL,
        }
    )
    verdicts = [line["verdict"] for line in lines]
    lines.append(
        {
            "goal": "all of the above",
            "measured": f"{verdicts.count(PASS)} of {len(verdicts)} pass",
            "verdict": combine(verdicts),
        }
    )
    return lines


def goal_summary(lines: list[dict], call: dict | None) -> list[str]:
    budget = "none" if not call or call["budget_s"] is None else f"{call['budget_s']:.0f} s"
    where = f" ({call['device']}, budget {budget})" if call else ""
    rows = [f"| {line['goal']} | {cell_text(line['measured'], 2000)} | {line['verdict']} |" for line in lines]
    return [f"### The goal{where}", "", "| goal | measured | verdict |", "|---|---|---|", *rows]
