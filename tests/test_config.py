"""The schema is the one home of the config's keys and defaults: the settings classes agree with it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from anisweep import config
from anisweep.checkpoints.catalogue import FAMILIES, final_step, params_millions
from anisweep.checkpoints.hub import MultiBERTs, Pythia
from anisweep.errors import ConfigError
from anisweep.extract.model import ExtractSettings
from anisweep.toy.train import ToySpec


def schema_properties(section: str) -> dict:
    node = config.schema()["properties"][section]
    return (node["additionalProperties"] if section == "toy" else node)["properties"]


def fields(cls) -> dict:
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


def test_extract_settings_are_the_schema_extract_section():
    assert set(schema_properties("extract")) == set(fields(ExtractSettings)) - {"threads"}
    assert config.defaults("extract") == {k: v for k, v in fields(ExtractSettings).items() if k != "threads"}


def test_toy_entries_are_the_toy_spec_fields():
    assert set(schema_properties("toy")) == set(fields(ToySpec)) | {"arch", "seed", "steps"}
    assert {k: v for k, v in config.defaults("toy").items() if k != "seed"} == fields(ToySpec)


def test_families_of_the_schema_are_the_catalogue_registry():
    models = config.schema()["properties"]["models"]["items"]["properties"]
    assert models["family"]["enum"] == list(FAMILIES)
    entry_keys = set().union(*(cls.entry_keys for cls in FAMILIES.values()))
    assert set(models) == entry_keys


def test_defaults_fill_nested_sections_without_touching_given_values():
    done = config.complete(
        {
            "models": [{"family": "pythia", "name": "pythia-70m", "steps": [0]}],
            "extract": {"seq_len": 64},
            "toy": {"t": {"arch": "bert", "steps": [0, 4]}},
        }
    )
    assert done["extract"]["seq_len"] == 64 and done["extract"]["n_sequences"] == 64
    assert done["toy"]["t"]["d_model"] == 64 and done["toy"]["t"]["steps"] == [0, 4]
    assert config.complete({"models": [{"family": "pythia", "name": "pythia-70m", "steps": [0]}]})["toy"] == {}


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"extract": {"seq_len": "long"}}, "extract.seq_len: 'long' is not of type 'integer'"),
        ({"toy": {"t": {"arch": "bert", "steps": [0], "seq_len": 2}}}, "toy.t.seq_len: 2 is less than the minimum"),
        ({"toy": {"t": {"arch": "llama", "steps": [0]}}}, "toy.t.arch: 'llama' is not one of"),
        ({"corpus": {"sorce": "text"}}, "'sorce' was unexpected"),
    ],
)
def test_schema_errors_name_the_key(bad, named):
    with pytest.raises(ConfigError) as error:
        config.complete({"models": [{"family": "pythia", "name": "pythia-70m", "steps": [0]}], **bad})
    assert named in str(error.value)


def test_the_config_module_imports_no_torch():
    """`snakemake -n` parses the workflow, which imports anisweep.config: it must not pay for torch."""
    modules = "anisweep.config, anisweep.checkpoints.catalogue, anisweep.checkpoints.preflight"
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_final_step_and_size_come_from_the_family():
    pythia = Pythia.resolve("pythia-1.4b-deduped", [0, 1000])
    assert final_step(pythia) == 143000 and params_millions(pythia[0]) == 1400
    bert = MultiBERTs.resolve("seed_0", [0, 20000])
    assert final_step(bert) == 2_000_000 and params_millions(bert[0]) == 110
