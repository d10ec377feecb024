"""`snakemake --report`: every caption under workflow/report/ renders without a docutils system message.

Snakemake renders a caption as its report does it here: the file plus its link targets, as a Jinja template
(trim_blocks, lstrip_blocks), then reStructuredText to HTML with docutils' publish_parts (snakemake/report/__init__.py,
FileRecord.render; the workflow description, workflow.rst, the same way into "html_body"). A message of level 2
(warning) or above lands in the report as a "Docutils System Messages" box.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils.core import publish_parts
from jinja2 import Environment

ROOT = Path(__file__).resolve().parents[2]
# snakemake calls publish_parts(..., writer_name="html"), which docutils 0.22 marks as pending deprecation
pytestmark = pytest.mark.filterwarnings('ignore:Argument "writer_name":PendingDeprecationWarning')

CAPTIONS = sorted((ROOT / "workflow" / "report").glob("*.rst"))

# What snakemake appends to every caption before rendering it (with no categories or files: the two panels' links).
RST_LINKS = """

.. _Workflow: javascript:show_panel('workflow')
.. _Statistics: javascript:show_panel('statistics')
"""


def rendered(text: str) -> tuple[str, str]:
    """The HTML of a caption as snakemake's report renders it, and docutils' messages about it."""
    job = SimpleNamespace(
        config=yaml.safe_load((ROOT / "config" / "config.yaml").read_text()),
        wildcards=SimpleNamespace(family="toy", model="toy-bert"),
    )
    source = Environment(trim_blocks=True, lstrip_blocks=True).from_string(text + RST_LINKS)
    messages = io.StringIO()
    parts = publish_parts(
        source.render(snakemake=job, categories={}, files=[]),
        writer_name="html",
        settings_overrides={"warning_stream": messages},
    )
    return parts["html_body"], messages.getvalue()


def test_a_substitution_like_bar_is_a_system_message():
    """The check itself: `|<b, w>|` is read as a substitution reference, the message snakemake's report shows."""
    html, messages = rendered("at most sqrt(n) |<b, w>| here")
    assert "system-message" in html and "Undefined substitution" in messages


@pytest.mark.parametrize("caption", CAPTIONS, ids=[c.name for c in CAPTIONS])
def test_every_caption_renders_without_a_docutils_message(caption):
    html, messages = rendered(caption.read_text(encoding="utf-8"))
    assert not messages, messages
    assert "system-message" not in html
