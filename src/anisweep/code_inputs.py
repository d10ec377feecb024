"""The package's own source files a module runs: the rules' code inputs, derived from the import graph.

A rule names the module its command runs (`measures.metrics`); its code input is that module's file and the
file of every anisweep module it imports, directly or through others, at the top or inside a function. Editing
any of them reruns the rule (Snakemake's mtime trigger); editing anything else does not. The command itself is
one function of its stage's command module (`cli.measures`), which holds that stage's other commands
too: the rule's code input holds that module's file and what it imports when it loads, never what its other
commands run.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "anisweep"
ROOT = Path(__file__).resolve().parent


def module_file(module: str) -> Path:
    """`measures.metrics` -> .../anisweep/measures/metrics.py; a package -> its __init__.py."""
    path = ROOT.joinpath(*module.split("."))
    if path.is_dir():
        return path / "__init__.py"
    file = path.with_suffix(".py")
    if not file.is_file():
        raise ModuleNotFoundError(f"{PACKAGE}.{module} has no source file under {ROOT}")
    return file


@functools.cache
def _is_module(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


# The fields of a node that hold statements: an import is a statement, so the walk never enters an expression.
_STATEMENT_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _runtime_statements(statements):
    """Every statement, nested ones too, but those under `if TYPE_CHECKING:` (imports for annotations only never
    run)."""
    for node in statements:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _runtime_statements(node.orelse)
            continue
        yield node
        for block in _STATEMENT_BLOCKS:
            yield from _runtime_statements(getattr(node, block, ()))


def imported_names(file: Path, package: str, on_load: bool = False) -> set[str]:
    """Every dotted name `file` imports when it runs (with `on_load`, when it loads: none of its functions' imports),
    made absolute: `import a.b` gives a.b; `from .c import d` in the package `package` gives package.c and
    package.c.d (d a module or an attribute)."""
    return _names_imported_by(ast.parse(file.read_text(), str(file)), package, on_load)


def _names_imported_by(tree: ast.Module, package: str, on_load: bool) -> set[str]:
    statements = tree.body
    if on_load:
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        statements = [node for node in statements if not isinstance(node, functions)]
    found = set()
    for node in _runtime_statements(statements):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                parent = ".".join([*parts, *([node.module] if node.module else [])])
            found.add(parent)
            found.update(f"{parent}.{a.name}" for a in node.names)
    return found


@functools.cache
def direct_imports(module: str, on_load: bool = False) -> frozenset[str]:
    """The anisweep modules `module` imports (relative to the package: `extract.model`); with `on_load`, those it
    imports when it loads, not inside a function."""
    return _direct_imports(module)[on_load]


@functools.cache
def _direct_imports(module: str) -> dict[bool, frozenset[str]]:
    """direct_imports of both kinds from one parse of the module."""
    file = module_file(module)
    tree = ast.parse(file.read_text(), str(file))
    package = ".".join(filter(None, [PACKAGE, module if file.name == "__init__.py" else module.rpartition(".")[0]]))
    found = {}
    for on_load in (False, True):
        names = {
            name[len(PACKAGE) + 1 :]
            for name in _names_imported_by(tree, package, on_load)
            if name.startswith(PACKAGE + ".")
        }
        found[on_load] = frozenset(name for name in names if name != module and _is_module(name))
    return found


def closure(*modules: str) -> list[str]:
    """`modules` and every anisweep module they import, transitively, sorted."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(direct_imports(module) - seen)
    return sorted(seen)


def code_inputs(*modules: str, commands: str | None = None) -> list[str]:
    """The source files of `modules` and of everything they import: a rule's `code` input. `commands`: the stage's
    command module that holds the rule's command (`cli.measures`), whose file and whose imports on load are
    in it too (what the command runs is `modules`)."""
    found = set(closure(*modules))
    if commands:
        found |= {commands, *closure(*direct_imports(commands, on_load=True))}
    return [str(module_file(m)) for m in sorted(found)]
