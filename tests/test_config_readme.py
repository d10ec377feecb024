"""config/README.md's tables of keys, defaults and meanings are the schema's (anisweep.config), so that a documented
default can never differ from the one the workflow uses: rewrite them with `python -m anisweep.config`."""

from __future__ import annotations

from pathlib import Path

import pytest

from anisweep import config

README = Path(__file__).resolve().parents[1] / "config" / "README.md"


def test_every_section_with_defaults_has_its_generated_table():
    assert sorted(config.generated_sections(README.read_text(encoding="utf-8"))) == sorted(config.documented_sections())


def test_config_readme_tables_are_generated_from_the_schema():
    text = README.read_text(encoding="utf-8")
    assert config.readme(text) == text, "config/README.md differs from the schema: run python -m anisweep.config"


def test_a_table_shows_the_schemas_default_and_description():
    table = config.section_table("gradients")
    assert "| `max_iter` | `500` | semi-NMF alternating-least-squares sweeps at most" in table
    assert "| `layers` | `null` |" in table and "| `rank` | `16` |" in table


def test_a_key_without_a_description_is_an_error(monkeypatch):
    broken = {**config.schema(), "properties": {"fetch": {"type": "object", "properties": {"retries": {"default": 5}}}}}
    monkeypatch.setattr(config, "schema", lambda: broken)
    with pytest.raises(ValueError, match=r"fetch\.retries has no description"):
        config.section_table("fetch")
