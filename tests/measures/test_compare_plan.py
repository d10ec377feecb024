"""The pairs the config's `compare` section names, and its clear errors before any job."""

from __future__ import annotations

import pytest

from anisweep.config import complete
from anisweep.errors import ConfigError
from anisweep.measures.compare_plan import Pair, of_model, pairs, roles

STEPS = {("toy", "a"): [0, 8, 32], ("toy", "b"): [0, 8]}


def section(**compare):
    return complete({"models": [{"family": "toy", "name": "a", "steps": "all"}], "compare": compare})["compare"]


def test_the_defaults_compare_each_step_with_the_final_and_previous_one_and_the_layers_at_both_ends():
    found = pairs(section(), {("toy", "a"): [0, 8, 32]})
    assert {(p.step, p.ref_step, p.role) for p in found} == {
        (0, 32, "final"),
        (8, 32, "final"),
        (8, 0, "previous"),
        (32, 8, "previous"),
        (0, 0, "layers"),
        (32, 32, "layers"),
    }
    assert Pair("toy", "a", 8, "a", 0, "previous").path == "results/toy/a/step8/compare/a.step0.parquet"
    assert Pair("toy", "a", 0, "a", 0, "layers").path == "results/toy/a/step0/compare/layers.parquet"


def test_a_named_step_and_a_seed_pair():
    found = pairs(section(against=[8], layer_steps=[], seeds=[["a", "b"]]), STEPS)
    assert {(p.model, p.step, p.ref_model, p.ref_step, p.role) for p in of_model(found, "toy", "a")} == {
        ("a", 0, "a", 8, "step"),
        ("a", 32, "a", 8, "step"),
        ("a", 0, "b", 0, "seed"),
        ("a", 8, "b", 8, "seed"),
    }
    assert {(p.step, p.role) for p in of_model(found, "toy", "b")} == {(0, "step")}


def test_disabled_compares_nothing():
    assert pairs(section(enabled=False), STEPS) == []


@pytest.mark.parametrize(
    ("compare", "message"),
    [
        ({"against": [32]}, r"step 32 is not a step of toy/b \(its steps: 0, 8\)"),
        ({"seeds": [["a", "c"]]}, r"\['c'\] not among the models swept"),
        ({"seeds": [["a", "a"]]}, "name two models of one family"),
        ({"layer_steps": ["first", "final", 500]}, r"compare.layer_steps: step 500 is not a step of any model swept"),
    ],
)
def test_pairs_that_cannot_be_made_are_config_errors(compare, message):
    with pytest.raises(ConfigError, match=message):
        pairs(section(**compare), STEPS)


def test_the_schema_refuses_an_unknown_reference_and_measure():
    with pytest.raises(ConfigError, match="compare"):
        section(against=["first"])
    with pytest.raises(ConfigError, match="compare"):
        section(measures=["rsa"])


def test_a_pair_in_two_roles_is_listed_in_each():
    """Against [final, previous, 0] on two steps: step 20000 against step 0 is both `previous` and `step`."""
    found = pairs(section(against=["final", "previous", 0], layer_steps=[]), {("toy", "a"): [0, 20000]})
    assert roles(found) == [
        ("final", "results/toy/a/step0/compare/a.step20000.parquet"),
        ("previous", "results/toy/a/step20000/compare/a.step0.parquet"),
        ("step", "results/toy/a/step20000/compare/a.step0.parquet"),
    ]


def test_a_layer_step_some_model_sweeps_is_computed_where_it_is_swept():
    found = pairs(section(against=[], layer_steps=[32]), STEPS)
    assert [(p.model, p.step, p.role) for p in found] == [("a", 32, "layers")]


def test_a_seed_pair_of_toys_with_other_tokenizers_stops_when_the_config_is_read():
    config = {
        "models": [{"family": "toy", "name": name, "steps": "all"} for name in ("a", "b")],
        "toy": {"a": {"arch": "bert", "steps": [0, 8]}, "b": {"arch": "gpt_neox", "steps": [0, 8]}},
        "compare": {"seeds": [["a", "b"]]},
    }
    message = (
        r"compare.seeds: \[a, b\]: the two toys tokenize the text differently \(a: WordPiece, vocab_size 2048; b: by"
    )
    with pytest.raises(ConfigError, match=message):
        complete(config)
    config["toy"]["b"] = {"arch": "bert", "seed": 1, "steps": [0, 8]}
    assert complete(config)["compare"]["seeds"] == [["a", "b"]]
