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
    "arguments",  # the command line's argument types (JSON, step lists), shared by the stages' commands
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
    "commands",  # each stage's `commands` module: its commands and their arguments, which run its code and others'
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
    if module.endswith(".commands"):
        return STAGES.index("commands")
    return STAGES.index(module.split(".")[0])


def test_every_module_has_a_stage():
    assert len(RULE_MODULES) >= 10  # the rules' code inputs were found
    assert {m.split(".")[0] for m in MODULES} <= set(STAGES)
    assert {m for m in MODULES if m.endswith(".commands")} >= {"checkpoints.commands", "extract.commands"}


@pytest.mark.parametrize("module", [m for m in MODULES if m.endswith(".commands")])
def test_a_stages_commands_import_no_other_stages_commands(module):
    """The command line is built by cli from every stage's commands; a stage's commands stand alone."""
    others = sorted(n for n in direct_imports(module) if n.endswith(".commands"))
    assert not others, f"{module} imports {others}"


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


def test_a_rules_code_input_holds_its_stages_commands_not_what_their_other_commands_run():
    files = code_inputs("measures.metrics", commands="measures.commands")
    assert str(ROOT / "measures" / "commands.py") in files
    assert str(ROOT / "arguments.py") in files  # what the commands module imports when it loads
    assert str(ROOT / "checkpoints" / "audit.py") not in files  # the sweep command runs it, metrics does not
    assert str(ROOT / "cli.py") not in files


RULES = ROOT.parents[1] / "workflow" / "rules"
CODE_OF = {  # ANALYSIS_CODE["plots"], WEIGHTS_CODE, code_inputs(...) -> the code_inputs call it names
    **{f'ANALYSIS_CODE["{key}"]': call for key, call in re.findall(r'"(\w+)": (code_inputs\([^)]*\))', COMMON_SMK)},
    **dict(re.findall(r"^(\w+_CODE) = (code_inputs\([^)]*\))", (RULES / "weights_inputs.smk").read_text(), re.M)),
}
RULE_COMMANDS = sorted(
    (name, command, CODE_OF.get(code, code))
    for smk in RULES.glob("*.smk")
    for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S)
    for code in re.findall(r"^        code=((?:\w+_CODE|code_inputs)\b.*),$", body, re.M)
    for command in re.findall(r'(?:\{params\.cli\} |figure_command\(\s*")([a-z-]+)', body)
)


@pytest.mark.parametrize(("rule", "command", "code"), RULE_COMMANDS)
def test_a_rules_code_input_names_the_commands_module_its_command_is_in(rule, command, code):
    from anisweep.cli import parser

    sub = next(a for a in parser()._actions if a.dest == "command")
    module = sub.choices[command].get_default("run").__module__.removeprefix("anisweep.")
    assert f'commands="{module}"' in code, f"rule {rule} runs `anisweep {command}` ({module}); its code input: {code}"


def test_every_rule_with_a_code_input_was_found():
    assert len(RULE_COMMANDS) >= 20
    assert {"metrics", "weights", "logit_lens", "plot_circuits", "gradients"} <= {rule for rule, _, _ in RULE_COMMANDS}
