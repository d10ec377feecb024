"""The house rules of the package (README, Layout): the floors below, each importing only itself and the floors
beneath it; no import circles, between modules or between floors; no private name imported across modules; and a
rule's code input (anisweep.code_inputs) holds every module its command imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from anisweep.code_inputs import ROOT, closure, code_inputs, direct_imports, module_file

# The floors of the house, bottom to top: a module imports its own floor and the floors beneath it, never one above.
# A floor is a top-level module or a stage folder; the stages follow the flow (checkpoints, extract, measures, ...),
# but where one stage's code uses another's (extract records the measures' sites), the used one sits lower.
FLOORS = (
    "errors",
    "arguments",  # the command line's argument types (JSON, step lists)
    "atomic",
    "job_failure",
    "code_inputs",
    "moments",  # streamed means and variances: arithmetic, no imports
    "schema",
    "sample_storage",  # the sampled vectors' storage precisions (float32, float16, int8): encode and decode
    "tables",
    "media",  # images and audio as the corpus: a sibling of the text corpus, which reads its files back through it
    "corpus_files",  # the corpus's local files, read and checked (no torch: also when the config is read)
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
    "cli",  # the command line: one module per stage (cli/extract.py, ...), each wiring the floors beneath it
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


def floor(module: str) -> int:
    return FLOORS.index(module.split(".")[0])


def test_every_module_stands_on_a_floor():
    assert len(RULE_MODULES) >= 10  # the rules' code inputs were found
    assert {m.split(".")[0] for m in MODULES} <= set(FLOORS)
    assert {"cli.checkpoints", "cli.extract", "cli.measures"} <= set(MODULES)


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("cli.")])
def test_a_stages_commands_import_no_other_stages_commands(module):
    """The command line (cli/__init__.py) is built from every stage's command module; each stands alone."""
    others = sorted(n for n in direct_imports(module) if n.split(".")[0] == "cli")
    assert not others, f"{module} imports {others}"


@pytest.mark.parametrize("module", MODULES)
def test_imports_run_down_the_floors(module):
    upward = sorted(n for n in direct_imports(module) if floor(n) > floor(module))
    assert not upward, f"{module} imports higher floors: {upward}"


def floor_imports() -> dict[str, set[str]]:
    """Which floors each floor imports (imports at any depth, TYPE_CHECKING blocks aside)."""
    found: dict[str, set[str]] = {f: set() for f in FLOORS}
    for module in MODULES:
        found[module.split(".")[0]] |= {n.split(".")[0] for n in direct_imports(module)} - {module.split(".")[0]}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for n in sorted(graph.get(node, ())):
            if n not in index:
                visit(n)
                low[node] = min(low[node], low[n])
            elif n in stack:
                low[node] = min(low[node], index[n])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_circles_between_floors():
    assert not circles(floor_imports())


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_readme_layout_lists_the_folders_in_floor_order():
    """README's Layout tree names every stage folder, in the order of FLOORS."""
    readme = (ROOT.parents[1] / "README.md").read_text()
    tree = readme.split("## Layout", 1)[1].split("```", 2)[1]
    folders = [f for f in FLOORS if (ROOT / f).is_dir()]
    named = re.findall(r"^  (\w+)/", tree, re.M)
    assert [f for f in named if f in folders] == folders, named


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
    if module.startswith("cli."):  # its file alone: the cli package's __init__ (the parser of every stage) is not run
        load = (
            "import importlib.util as u; "
            f"s = u.spec_from_file_location('command_module', {str(module_file(module))!r}); "
            "s.loader.exec_module(u.module_from_spec(s))"
        )
    else:
        load = f"import importlib; importlib.import_module('anisweep.{module}')"
    code = f"{load}; import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.startswith('anisweep.'))))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    loaded = {m.removeprefix("anisweep.") for m in loaded}
    packages_only = {m for m in loaded if (ROOT / m.replace(".", "/")).is_dir()}
    missing = sorted(loaded - set(closure(module)) - packages_only)
    assert not missing, f"{module}'s code input misses {missing}"


def test_a_rules_code_input_holds_its_stages_commands_not_what_their_other_commands_run():
    files = code_inputs("measures.metrics", commands="cli.measures")
    assert str(ROOT / "cli" / "measures.py") in files
    assert str(ROOT / "arguments.py") in files  # what the commands module imports when it loads
    assert str(ROOT / "checkpoints" / "audit.py") not in files  # the sweep command runs it, metrics does not
    assert str(ROOT / "cli" / "__init__.py") not in files


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
