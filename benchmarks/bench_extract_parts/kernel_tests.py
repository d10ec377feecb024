"""The `tests` part: the kernel tests (KERNEL_TESTS, `python -m pytest -q`) in a pytest process without
TRITON_INTERPRET (conftest sets it for the interpreter's tests, the CUDA ones run in processes of their own without
it): how many ran, passed, failed and were skipped, read from pytest's JUnit XML. A skipped test counts as NOT run,
never as passed; the part passes only if every test ran and passed, the CUDA-only ones (CUDA_TESTS) included.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from .core import BUDGET_SPENT, FAIL, NOT_RUN, PASS, ROOT, clean_env, part_timeout, run_limited

KERNEL_TESTS = [
    "tests/extract/test_attention_triton.py",
    "tests/extract/test_host_sync.py",
    "tests/extract/test_kernel_compile.py",
]
CUDA_TESTS = ("test_compiled_kernels_on_cuda", "test_on_a_gpu_no_op_of_a_run_synchronises")  # skipped without one
FAILURE_CHARS = 1500  # of each failed kernel test's report kept in the JSON and the Markdown


def kernel_tests(a) -> dict:
    """KERNEL_TESTS in a pytest process without TRITON_INTERPRET; its JUnit XML's counts (junit_outcomes)."""
    timeout = part_timeout(a, "tests")
    command = ["python", "-m", "pytest", "-q", *KERNEL_TESTS]
    if timeout is not None and timeout <= 0:
        return {"command": " ".join(command), **BUDGET_SPENT}
    print(f"[kernel tests] {' '.join(command)} ...", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, *command[1:], "-p", "no:cacheprovider", f"--junitxml={report}"]
        try:
            proc = run_limited(cmd, clean_env(), timeout, cwd=ROOT)
            res, tail = {"returncode": proc.returncode}, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            res, tail = {"error": f"killed at the time budget, after {time.perf_counter() - started:.0f} s"}, ""
        xml = report.read_text() if report.exists() else None
    res = {"command": " ".join(command), **res, **junit_outcomes(xml), "seconds": time.perf_counter() - started}
    res["tail"] = tail
    print(f"  {kernel_tests_line(res)['measured']}", flush=True)
    return res


def junit_outcomes(xml: str | None) -> dict:
    """Every test's outcome from pytest's JUnit XML: passed, failed, error or skipped (with pytest's reason), and
    each failure's or error's message with the end of its report (the process's own output tail can be all
    warnings)."""
    outcomes, reasons, failures = {}, {}, {}
    for case in ET.fromstring(xml).iter("testcase") if xml else ():
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        outcomes[test] = {"failure": "failed"}.get(outcome, outcome)
        if outcome == "skipped":
            reasons[test] = kinds["skipped"].get("message", "")
        elif outcome != "passed":
            report = kinds[outcome]
            failures[test] = f"{report.get('message', '')}\n{(report.text or '')[-FAILURE_CHARS:]}".strip()
    return {"outcomes": outcomes, "skip_reasons": reasons, "failures": failures}


def tally_tests(res: dict) -> dict:
    outcomes = res.get("outcomes", {})
    tally = {
        kind: sorted(t for t, o in outcomes.items() if o == kind) for kind in ("passed", "failed", "error", "skipped")
    }
    tally["cuda"] = {
        name: next((o for t, o in outcomes.items() if t.split("::")[-1].split("[")[0] == name), "missing")
        for name in CUDA_TESTS
    }
    return tally


def kernel_tests_line(res: dict | None) -> dict:
    """The kernel tests' counts; pass only if every test ran and passed, the CUDA-only ones too: a skipped test
    is NOT run."""
    goal = "CUDA kernel tests run and pass (" + ", ".join(Path(t).name for t in KERNEL_TESTS) + ")"
    if not res or "error" in res and not res.get("outcomes"):
        error = (res or {}).get("error", "not run")
        return {"goal": goal, "measured": error, "verdict": NOT_RUN if error.startswith("not run") else FAIL}
    tally = tally_tests(res)
    ran = len(tally["passed"]) + len(tally["failed"]) + len(tally["error"])
    cuda = ", ".join(
        f"{name} {'passed' if o == 'passed' else 'NOT run' if o in ('skipped', 'missing') else o}"
        for name, o in tally["cuda"].items()
    )
    measured = (
        f"{ran} ran: {len(tally['passed'])} passed, {len(tally['failed'])} failed, {len(tally['error'])} errors; "
        f"{len(tally['skipped'])} skipped (NOT run); CUDA-only: {cuda}"
    )
    if res.get("error"):
        measured += f"; {res['error']}"
    if tally["failed"] or tally["error"] or res.get("error") or res.get("returncode") not in (0, None) or not ran:
        verdict = FAIL
    elif tally["skipped"] or any(o != "passed" for o in tally["cuda"].values()):
        verdict = NOT_RUN
    else:
        verdict = PASS
    return {"goal": goal, "measured": measured, "verdict": verdict}


def kernel_tests_summary(res: dict) -> list[str]:
    line = kernel_tests_line(res)
    lines = [
        "### Kernel tests",
        "",
        f"`{res['command']}`: {line['measured']} ({res.get('seconds', 0):.0f} s): **{line['verdict']}**",
    ]
    tally = tally_tests(res) if res.get("outcomes") else {"failed": [], "error": [], "skipped": []}
    for kind in ("failed", "error"):
        for test in tally[kind]:
            lines.append(f"- {kind}: {test}")
            said = res.get("failures", {}).get(test)
            lines += ["", "  ```", *(f"  {line}" for line in said.splitlines()[-12:]), "  ```"] if said else []
    lines += [f"- skipped, NOT run: {test} ({res['skip_reasons'].get(test, '')})" for test in tally["skipped"]]
    return lines
