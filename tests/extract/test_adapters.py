"""Facts about architectures kept in one place: the toy architectures, the adapters, the site names."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from anisweep import config
from anisweep.adapters import ADAPTERS
from anisweep.adapters.base import TRANSFORMERLENS_HOOKS, transformerlens_table
from anisweep.toy.tokenizers import ARCHS

from conftest import (
    albert_config,
    bert_config,
    canine_config,
    gpt2_config,
    llama_config,
    neox_config,
    olmo2_config,
    olmo_config,
    roberta_config,
    t5_config,
)

ROOT = Path(__file__).resolve().parents[2]


def find_key(node, key):
    """Every value stored under `key` anywhere in a nested dict/list."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                yield value
            yield from find_key(value, key)
    elif isinstance(node, list):
        for value in node:
            yield from find_key(value, key)


def test_the_schema_offers_exactly_the_toy_architectures():
    """ARCHS is the one list of toy architectures: the schema's toy `arch` enum must equal it."""
    schema = config.schema()
    enums = [value["enum"] for value in find_key(schema, "arch") if isinstance(value, dict) and "enum" in value]
    assert enums == [list(ARCHS)]


def test_every_toy_architecture_has_an_adapter():
    model_types = {model_type for adapter in ADAPTERS for model_type in adapter.model_types}
    assert set(ARCHS) <= model_types


def test_the_adapters_readme_shows_the_hook_table():
    readme = (ROOT / "src" / "anisweep" / "adapters" / "README.md").read_text()
    assert transformerlens_table() in readme


@pytest.mark.parametrize(
    ("cls", "config"),
    [
        (transformers.BertModel, bert_config),
        (transformers.GPTNeoXModel, neox_config),
        (transformers.GPT2Model, gpt2_config),
        (transformers.LlamaModel, llama_config),
        (transformers.OlmoModel, olmo_config),
        (transformers.Olmo2Model, olmo2_config),
        (transformers.RobertaModel, roberta_config),
        (transformers.AlbertModel, albert_config),
        (transformers.T5Model, t5_config),
        (transformers.CanineModel, canine_config),
        (
            transformers.ViTModel,
            lambda: transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2),
        ),
        (transformers.SegformerModel, lambda: transformers.SegformerConfig(depths=[1, 1, 1, 1])),
        (transformers.CvtModel, lambda: transformers.CvtConfig(depth=[1, 2, 3])),
        (transformers.ResNetModel, lambda: transformers.ResNetConfig(hidden_sizes=[8, 16], depths=[1, 1])),
    ],
)
def test_every_site_the_adapters_record_has_a_hook_name(cls, config):
    model = cls(config())
    adapter = next(a for a in ADAPTERS if model.config.model_type in a.model_types)
    base = adapter.base_model(model)
    named = " / ".join(site for _, site in TRANSFORMERLENS_HOOKS)
    for site in adapter.layernorm_sites(base):
        assert f"{site.site}_in" in named and f"{site.site}_out" in named
    for rope in adapter.geometry(model.config).ropes:
        assert f"rope = {rope}" in named
