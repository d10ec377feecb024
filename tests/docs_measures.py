"""docs/measures.md's example package, built from the doc's own code blocks: the tests run what the doc shows."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "measures.md"

#: pyproject.toml of the package, with the doc's entry points for the stream measure and the weight measure
PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mymeasures"
version = "0.1"

[project.entry-points."anisweep.measures"]
attention_output_norm = "mymeasures.heads:AttentionOutputNorm"
qk_norm = "mymeasures.weights:qk_norm"

[tool.setuptools]
packages = ["mymeasures"]
"""


def docs_package(root: Path) -> Path:
    """The package `mymeasures` under `root`, from the doc's code blocks that name their file (`# mymeasures/x.py`)."""
    blocks = re.findall(r"```python\n# (mymeasures/\w+\.py)\n(.*?)```", DOCS.read_text(), re.S)
    assert {path for path, _ in blocks} == {
        "mymeasures/rank.py",
        "mymeasures/heads.py",
        "mymeasures/sinks.py",
        "mymeasures/weights.py",
        "mymeasures/similar.py",
    }
    (root / "mymeasures").mkdir(parents=True, exist_ok=True)
    (root / "mymeasures" / "__init__.py").write_text("")
    for path, code in blocks:
        (root / path).write_text(code)
    return root
