"""The schema is the one home of the config's keys and defaults: the settings classes agree with it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml

from anisweep import config, schema
from anisweep.checkpoints.catalogue import COMMON_ENTRY_KEYS, FAMILIES, final_step, params_millions
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
    entry_keys = set().union(*(cls.entry_keys for cls in FAMILIES.values()), COMMON_ENTRY_KEYS)
    assert set(models) == entry_keys


def test_the_bootstrap_measures_of_the_schema_are_those_resampled():
    from anisweep.measures import pair_bootstrap, sample_bootstrap, sum_bootstrap

    measures = schema_properties("bootstrap")["measures"]["items"]["enum"]
    assert measures == list(sample_bootstrap.MEASURES + pair_bootstrap.MEASURES + sum_bootstrap.MEASURES)


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


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (
            {"untrained": {"inits": [{"modle": "toy-bert"}]}},
            "untrained.inits.0: Additional properties are not allowed ('modle' was unexpected); "
            "allowed keys: [family, model, step]",
        ),
        (
            {"untrained": {"inits": ["gpt2"]}},
            "untrained.inits.0: 'gpt2' is none of the forms allowed here: one of [bert, gpt_neox] or a mapping with "
            "keys [family, model, step] (model required)",
        ),
        (
            {"models": [{"family": "pythia", "name": "pythia-70m", "steps": {"stp": 3}}]},
            "models.0.steps: Additional properties are not allowed ('stp' was unexpected); "
            "allowed keys: [every, start, stop]",
        ),
        (
            {"models": [{"family": "pythia", "name": "pythia-70m", "steps": "al"}]},
            "models.0.steps: 'al' is none of the forms allowed here: one of [all, final] or a list or a mapping",
        ),
        ({"untrained": {"inits": [{"model": "m", "step": -1}]}}, "untrained.inits.0.step: -1 is less than the minimum"),
        (
            {"corpus": {"sorce": "text"}},
            "allowed keys: [column, config, max_items, max_seconds, modality, name, paths, resample, seed, source, "
            "split]",
        ),
    ],
    ids=["unknown-key-in-choice", "no-form-fits", "unknown-key-in-nested-choice", "nested-no-form", "bad-value", "top"],
)
def test_schema_errors_inside_a_choice_name_the_key_and_what_is_allowed(bad, named):
    """A oneOf/anyOf error used to say only "is not valid under any of the given schemas"."""
    with pytest.raises(ConfigError) as error:
        config.complete({"models": [{"family": "pythia", "name": "pythia-70m", "steps": [0]}], **bad})
    assert named in str(error.value)


@pytest.mark.parametrize(
    ("phases", "named"),
    [
        ({"smooth": -1}, "phases.smooth: -1 is less than the minimum of 0"),
        ({"smooth": 1.5}, "phases.smooth: 1.5 is not of type 'integer'"),
        ({"tolerance": 0}, "phases.tolerance: 0 is less than or equal to the minimum of 0"),
        ({"min_steps": 2}, "phases.min_steps: 2 is less than the minimum of 3"),
        ({"window": 3}, "phases: Additional properties are not allowed ('window' was unexpected); allowed keys: "),
    ],
)
def test_a_bad_phase_rule_setting_is_named(phases, named):
    with pytest.raises(ConfigError) as error:
        config.complete({"models": [{"family": "toy", "name": "toy-neox", "steps": "all"}], "phases": phases})
    assert named in str(error.value)


TOY = {"arch": "bert", "steps": [0, 4], "d_model": 32, "n_heads": 4, "n_layers": 2, "seq_len": 64}


def toy_config(**sections) -> dict:
    return {
        "models": [{"family": "toy", "name": "t", "steps": "all"}],
        "toy": {"t": dict(TOY)},
        "extract": {"seq_len": 64, "sample_tokens": 64},
        **sections,
    }


@pytest.mark.parametrize(
    ("sections", "named"),
    [
        ({"gradients": {"enabled": True, "rank": 32}}, "gradients.rank 32 is not less than d_model = 32 of toy/t"),
        ({"gradients": {"enabled": True, "rank": [4, 40], "sample_tokens": 64}}, "gradients.rank 40 is not less"),
        (
            {"gradients": {"enabled": True, "rank": 8, "sample_tokens": 4}},
            "gradients.sample_tokens = 4 is less than gradients.rank 8",
        ),
        ({"gradients": {"enabled": True, "steps": []}}, "gradients.steps is [] while gradients.enabled is true"),
        (
            {"extract": {"seq_len": 64, "sample_tokens": 64, "score_bins": {"low": 5, "high": -5}}},
            "extract.score_bins: low = 5 is not below high = -5",
        ),
        ({"qk_svd": {"heads": [[0, 1], [2, 0]]}}, "qk_svd.heads: [[2, 0]] are not [layer, head] pairs of toy/t"),
        ({"qk_svd": {"heads": [[1, 4]]}}, "which has layers 0..1 and heads 0..3"),
        ({"toy": {"t": {**TOY, "n_heads": 5}}}, "toy.t: d_model = 32 is not a multiple of n_heads = 5"),
        ({"untrained": {"enabled": True, "norms": [0, 1, 2, 1.0]}}, "untrained.norms: [1] listed more than once"),
        ({"untrained": {"enabled": True, "d_model": 30}}, "untrained: d_model = 30 is not a multiple of n_heads = 12"),
    ],
    ids=[
        "rank-d-model",
        "rank-list",
        "sample-below-rank",
        "no-gradient-steps",
        "score-bins-reversed",
        "qk-svd-layer",
        "qk-svd-head",
        "toy-heads",
        "untrained-norms-twice",
        "untrained-heads",
    ],
)
def test_values_the_schema_cannot_check_are_errors_when_the_config_is_read(sections, named):
    with pytest.raises(ConfigError) as error:
        config.checkpoints(config.complete(toy_config(**sections)))
    assert named in str(error.value)


def test_the_same_values_within_bounds_pass():
    """The control of the test above: each value just inside its bound."""
    sections = {
        "gradients": {"enabled": True, "rank": [4, 31], "sample_tokens": 31, "steps": [4]},
        "extract": {"seq_len": 64, "sample_tokens": 64, "score_bins": {"low": -1, "high": 1}},
        "qk_svd": {"heads": [[1, 3]]},
        "untrained": {"enabled": True, "norms": [0, 1, 2]},
    }
    assert len(config.checkpoints(config.complete(toy_config(**sections)))) == 2
    # disabled sections are not checked
    assert config.complete(toy_config(gradients={"enabled": False, "steps": [], "rank": 100, "sample_tokens": 2}))


@pytest.mark.parametrize(
    ("model", "rank", "heads", "named"),
    [
        ("pythia-14m", 128, "auto", "gradients.rank 128 is not less than d_model = 128 of pythia/pythia-14m"),
        ("pythia-14m", 16, [[6, 0]], "qk_svd.heads: [[6, 0]] are not [layer, head] pairs of pythia/pythia-14m"),
        ("pythia-14m", 16, [[5, 4]], "which has layers 0..5 and heads 0..3"),
        ("pythia-14m", 127, [[5, 3]], None),
    ],
)
def test_hub_models_are_checked_against_their_catalogued_shape(model, rank, heads, named):
    done = {
        "models": [{"family": "pythia", "name": model, "steps": [0, 1000]}],
        "gradients": {"enabled": True, "rank": rank, "steps": [1000]},
        "qk_svd": {"heads": heads},
    }
    if named is None:
        assert len(config.checkpoints(config.complete(done))) == 2
        return
    with pytest.raises(ConfigError) as error:
        config.checkpoints(config.complete(done))
    assert named in str(error.value)


def test_the_rank_is_checked_only_against_the_models_the_gradient_analysis_covers():
    done = {
        "models": [
            {"family": "pythia", "name": "pythia-14m", "steps": [0]},
            {"family": "pythia", "name": "pythia-70m", "steps": [1000]},
        ],
        "gradients": {"enabled": True, "rank": 200, "sample_tokens": 4096, "steps": [1000]},
    }
    assert len(config.checkpoints(config.complete(done))) == 2  # pythia-14m (d_model 128) is not analysed
    done["gradients"]["steps"] = None
    with pytest.raises(ConfigError, match="of pythia/pythia-14m"):
        config.checkpoints(config.complete(done))


def test_the_schema_read_with_libyaml_is_the_document_pyyaml_reads():
    assert schema.schema() == yaml.safe_load(schema.SCHEMA_PATH.read_text())
