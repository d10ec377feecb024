"""The house rules of the package (README, Layout): no import circles, imports run one way through the stages,
no private name is imported across modules, and a rule's code input (anisweep.code_inputs) holds every module
its command imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from anisweep.code_inputs import ROOT, closure, code_inputs, direct_imports

# The flow, in order: a module may import its own stage and the stages before it, never one after it.
STAGES = (
    "errors",
    "atomic",
    "job_failure",
    "code_inputs",
    "moments",  # streamed means and variances: arithmetic, no imports
    "schema",
    "tables",
    "media",  # images and audio as the corpus: a sibling of the text corpus, which reads its files back through it
    "corpus",
    "adapters",
    "checkpoints",
    "config",
    "toy",
    "measures",
    "weights",  # a checkpoint's tensors read without a model: the weight measures' and the logit lens's jobs
    "extract",
    "tangent",
    "mechanism",
    "live",
    "plots",
    "results",
    "explore",  # the explorer page: reads a results folder
    "cli",
    "worker",  # the warm worker: runs cli.main in a fork of a process that imported the stages once
    "__main__",
)
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in ROOT.rglob("*.py")
    if p.name != "__init__.py" or p.parent != ROOT
)
# The modules the rules name as their code inputs (workflow/rules/common.smk, ANALYSIS_CODE).
COMMON_SMK = (ROOT.parents[1] / "workflow" / "rules" / "common.smk").read_text()
RULE_MODULES = sorted(
    {m for args in re.findall(r"code_inputs\(([^)]*)\)", COMMON_SMK) for m in re.findall(r'"([\w.]+)"', args)}
)


def stage(module: str) -> int:
    return STAGES.index(module.split(".")[0])


def test_every_module_has_a_stage():
    assert len(RULE_MODULES) >= 10  # the rules' code inputs were found
    assert {m.split(".")[0] for m in MODULES} <= set(STAGES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_run_one_way_through_the_stages(module):
    upward = sorted(n for n in direct_imports(module) if stage(n) > stage(module))
    assert not upward, f"{module} imports later stages: {upward}"


def test_no_import_circles():
    graph = {m: set(direct_imports(m)) - {m} for m in MODULES}
    state: dict[str, int] = {}

    def visit(module, path):
        if state.get(module) == 1:
            cycle = path[path.index(module) :] + [module]
            pytest.fail(f"import circle: {' -> '.join(cycle)}")
        if state.get(module) == 2:
            return
        state[module] = 1
        for n in sorted(graph.get(module, ())):
            visit(n, [*path, module])
        state[module] = 2

    for m in MODULES:
        visit(m, [])


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("anisweep"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name[0] == "_"]
    assert not found


def test_code_inputs_follow_imports_inside_functions():
    # tangent.fixed imports tangent.shares inside fit_bases only; measures.metrics reaches tables through geometry
    assert "tangent.shares" in closure("tangent.fixed")
    assert str(ROOT / "tangent" / "shares.py") in code_inputs("tangent.fixed")
    assert "tables" in closure("measures.metrics")
    assert "extract.model" not in closure("measures.metrics")  # editing extract reruns no metrics job


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("module", RULE_MODULES)
def test_a_rules_code_input_holds_every_module_its_command_imports(module):
    """Independent of the static walk: the anisweep modules a fresh interpreter has loaded after importing the
    module (and calling nothing) are all in its code input."""
    code = (
        f"import importlib, json, sys; importlib.import_module('anisweep.{module}'); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('anisweep.'))))"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    loaded = {m.removeprefix("anisweep.") for m in loaded}
    packages_only = {m for m in loaded if (ROOT / m.replace(".", "/")).is_dir()}
    missing = sorted(loaded - set(closure(module)) - packages_only)
    assert not missing, f"{module}'s code input misses {missing}"
