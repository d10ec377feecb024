"""Checkpoint catalogues: grids, names, tokens seen, and the errors a wrong config gets."""

from __future__ import annotations

import json
import re

import pytest

from anisweep.checkpoints import grids
from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.catalogue import resolve, resolve_all, tokens_per_step
from anisweep.checkpoints.hub import MULTIBERTS_STEPS, PYTHIA_STEPS, MultiBERTs, Pythia
from anisweep.errors import ConfigError


def pythia(name="pythia-70m", steps="all", **kw):
    return resolve({"family": "pythia", "name": name, "steps": steps, **kw})


def multiberts(name="seed_0", steps="all", **kw):
    return resolve({"family": "multiberts", "name": name, "steps": steps, **kw})


# ---------------------------------------------------------------------------------------------- Pythia


def test_pythia_grid_is_the_published_one():
    assert len(PYTHIA_STEPS) == 154
    assert PYTHIA_STEPS[:12] == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
    assert PYTHIA_STEPS[-1] == 143000
    cks = pythia(steps="all")
    assert [c.step for c in cks] == list(PYTHIA_STEPS)
    c = cks[-1]
    assert (c.family, c.model, c.repo_id, c.revision, c.path) == (
        "pythia",
        "pythia-70m",
        "EleutherAI/pythia-70m",
        "step143000",
        None,
    )
    assert c.tokens_seen == 143000 * 2_097_152 == 299_892_736_000
    assert c.key == "pythia/pythia-70m/step143000"


@pytest.mark.parametrize(
    "name, seed",
    [
        ("pythia-70m", 1234),
        ("pythia-70m-deduped", 1234),
        ("pythia-12b-deduped", 1234),
        ("pythia-160m-seed3", 3),
        ("pythia-14m-seed1", 1),
        ("pythia-410m-seed9", 9),
        ("pythia-1.4b", 1234),
    ],
)
def test_pythia_names(name, seed):
    (c,) = pythia(name, [1000])
    assert c.repo_id == f"EleutherAI/{name}" and c.revision == "step1000" and c.seed == seed
    assert c.tokens_seen == 1000 * tokens_per_step("pythia")


def test_pythia_step_lists_and_ranges():
    assert [c.step for c in pythia(steps=[0, 1000, 143000])] == [0, 1000, 143000]
    assert [c.step for c in pythia(steps=[143000, 0, 0])] == [0, 143000]  # sorted, once each
    assert [c.step for c in pythia(steps=512)] == [512]
    assert [c.step for c in pythia(steps="final")] == [143000]
    # a range selects the grid steps in [start, stop] spaced by `every` from start (stop inclusive)
    assert len(pythia(steps={"start": 0, "stop": 143000, "every": 1000})) == 144
    assert [c.step for c in pythia(steps={"start": 0, "stop": 10000, "every": 5000})] == [0, 5000, 10000]
    assert [c.step for c in pythia(steps={"start": 1, "stop": 512})] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("pythia-71m", "pythia-71m is not a Pythia model; nearest: pythia-70m"),
        ("pythia-14m-deduped", "no -deduped variant; nearest: pythia-14m"),
        ("pythia-1b-seed3", "nearest: pythia-1b, pythia-410m-seed3"),
        ("pythia-160m-seed12", "nearest: pythia-160m-seed9, pythia-160m"),
        ("pythia-160m-seed0", "nearest: pythia-160m-seed1, pythia-160m"),
        ("gpt2", "gpt2 is not a Pythia model; nearest:"),
    ],
)
def test_pythia_unknown_names_name_the_nearest(name, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        pythia(name, [0])


def test_unknown_step_names_the_neighbours():
    with pytest.raises(ConfigError, match=r"step 1500 is not in the pythia grid; nearest: 1000, 2000"):
        pythia(steps=[0, 1500])
    with pytest.raises(ConfigError, match=r"step 3 is not in the pythia grid; nearest: 2, 4"):
        pythia(steps=[3])
    with pytest.raises(ConfigError, match=r"step 150000 .* nearest: 143000$"):
        pythia(steps=[150000])
    with pytest.raises(ConfigError, match=r"selects no step"):
        pythia(steps={"start": 3, "stop": 3})


@pytest.mark.parametrize(
    "entry, expected",
    [
        ({"family": "pythai", "name": "pythia-70m", "steps": "all"}, "family 'pythai' is unknown; nearest: pythia"),
        ({"family": "pythia", "name": "pythia-70m", "step": [0]}, "key 'step' .* is unknown; nearest: steps"),
        ({"family": "pythia", "name": "pythia-70m", "steps": [0], "tokens_per_step": 5}, "fixed at 2097152"),
        ({"family": "pythia", "name": "pythia-70m"}, "missing 'steps'"),
        ({"family": "pythia", "name": "pythia-70m", "steps": "everything"}, "not a step selection; nearest: .*all"),
        (
            {"family": "pythia", "name": "pythia-70m", "steps": {"start": 0, "evry": 2}},
            "unknown key 'evry'.*nearest: every",
        ),
        ({"family": "pythia", "name": "pythia-70m", "steps": [1.5]}, "must be an integer"),
        ({"family": "pythia", "steps": [0]}, "needs a 'name'"),
    ],
)
def test_config_errors(entry, expected):
    with pytest.raises(ConfigError, match=expected):
        resolve(entry)


def test_unrelated_keys_are_left_to_other_stages():
    assert len(pythia(steps=[0], batch_size=4)) == 1


# ---------------------------------------------------------------------------------------------- MultiBERTs


def test_multiberts_grid_and_repos():
    assert len(MULTIBERTS_STEPS) == 29
    for seed in range(5):
        cks = multiberts(f"seed_{seed}", "all")
        assert len(cks) == 29
        assert all(c.revision == "main" and c.seed == seed for c in cks)
    cks = multiberts("seed_0", {"start": 0, "stop": 200000, "every": 20000})
    assert [c.step for c in cks] == list(range(0, 200001, 20000))
    by_step = {c.step: c for c in multiberts("seed_0", "all")}
    assert by_step[0].repo_id == "google/multiberts-seed_0-step_0k"
    assert by_step[20000].repo_id == "google/multiberts-seed_0-step_20k"
    assert by_step[20000].tokens_seen == 20000 * 131_072
    assert by_step[300000].repo_id == "google/multiberts-seed_0-step_300k"
    # step 2M inside a sweep stays in the intermediate release; `final` is the separately published model
    assert by_step[2_000_000].repo_id == "google/multiberts-seed_0-step_2000k"
    (final,) = multiberts("seed_0", "final")
    assert (final.step, final.repo_id) == (2_000_000, "google/multiberts-seed_0")


def test_multiberts_final_only_seeds():
    (c,) = multiberts("seed_17", "all")
    assert (c.step, c.repo_id, c.seed, c.tokens_seen) == (
        2_000_000,
        "google/multiberts-seed_17",
        17,
        2_000_000 * 131_072,
    )
    with pytest.raises(ConfigError, match=r"step 20000 is not in the multiberts grid of seed_7 \(seeds 5-24 only"):
        multiberts("seed_7", [20000])


def test_multiberts_errors():
    with pytest.raises(ConfigError, match="seed_25 is not a MultiBERTs model; nearest: seed_24"):
        multiberts("seed_25")
    with pytest.raises(ConfigError, match="nearest: seed_0"):
        multiberts("seed0")
    with pytest.raises(
        ConfigError, match="step 210000 is not in the multiberts grid of seed_1; nearest: 200000, 300000"
    ):
        multiberts("seed_1", [210000])
    assert MultiBERTs.names()[-1] == "seed_24" and "pythia-410m-seed9" in Pythia.names()


# ---------------------------------------------------------------------------------------------- local runs


def make_run(root, names, files=("config.json",)):
    root.mkdir(parents=True, exist_ok=True)
    for n in names:
        (root / n).mkdir()
        for f in files:
            (root / n / f).write_text("{}")
    return root


def test_local_step_folders(tmp_path):
    run = make_run(tmp_path / "run", ["step0", "step100", "step20", "notes", "stepX"])
    (run / "README.md").write_text("hi")
    cks = resolve({"family": "local", "name": "my-run", "path": str(run), "steps": "all"})
    assert [c.step for c in cks] == [0, 20, 100]
    assert cks[1].path == str(run / "step20") and cks[1].repo_id is None and cks[1].revision is None
    assert cks[1].tokens_seen is None  # unknown without tokens_per_step
    assert cks[1].key == "local/my-run/step20"
    cks = resolve({"family": "local", "name": "my-run", "path": run, "steps": [20], "tokens_per_step": 4096, "seed": 7})
    assert cks[0].tokens_seen == 20 * 4096 and cks[0].seed == 7


def test_local_trainer_checkpoints(tmp_path):
    run = make_run(tmp_path / "out", ["checkpoint-500", "checkpoint-1000", "runs"])
    (run / "checkpoint-1000" / "trainer_state.json").write_text(json.dumps({"num_input_tokens_seen": 123456}))
    cks = resolve({"family": "local", "name": "hf-run", "path": run, "steps": {"start": 0, "stop": 1000}})
    assert [(c.step, c.tokens_seen) for c in cks] == [(500, None), (1000, 123456)]
    with pytest.raises(ConfigError, match=r"step 700 is not in the checkpoints of hf-run .*; nearest: 500, 1000"):
        resolve({"family": "local", "name": "hf-run", "path": run, "steps": [700]})


def test_local_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        ConfigError, match=r"no checkpoints in .*empty; expected subfolders named step\{N\}/ or checkpoint-\{N\}/"
    ):
        resolve({"family": "local", "name": "r", "path": empty, "steps": "all"})
    make_run(tmp_path / "odd", ["final", "epoch1"])
    with pytest.raises(ConfigError, match=r"checkpoint-\{N\}/.*found: epoch1/, final/"):
        resolve({"family": "local", "name": "r", "path": tmp_path / "odd", "steps": "all"})
    with pytest.raises(ConfigError, match="is not a folder"):
        resolve({"family": "local", "name": "r", "path": tmp_path / "nope", "steps": "all"})
    with pytest.raises(ConfigError, match="needs a 'path'"):
        resolve({"family": "local", "name": "r", "steps": "all"})
    make_run(tmp_path / "both", ["step5", "checkpoint-5"])
    with pytest.raises(ConfigError, match="step 5 appears twice"):
        resolve({"family": "local", "name": "r", "path": tmp_path / "both", "steps": "all"})
    with pytest.raises(ConfigError, match="plain folder name"):
        resolve({"family": "local", "name": "a/b", "path": tmp_path / "both", "steps": "all"})


# ---------------------------------------------------------------------------------------------- toy

TOY = {
    "toy-bert": {"steps": [0, 16, 64], "batch_size": 8, "seq_len": 32},
    "toy-neox": {"steps": {"start": 0, "stop": 100, "every": 25}, "batch_size": 4, "seq_len": 16, "seed": 3},
}


def test_toy(tmp_path):
    cks = resolve({"family": "toy", "name": "toy-bert", "steps": "all"}, toy_root=tmp_path, toy_specs=TOY)
    assert [(c.step, c.tokens_seen) for c in cks] == [(0, 0), (16, 16 * 256), (64, 64 * 256)]
    assert cks[2].path == str(tmp_path / "toy-bert" / "step64") and cks[2].key == "toy/toy-bert/step64"
    cks = resolve({"family": "toy", "name": "toy-neox", "steps": [25, 100]}, toy_root=tmp_path, toy_specs=TOY)
    assert [(c.step, c.tokens_seen, c.seed) for c in cks] == [(25, 25 * 64, 3), (100, 100 * 64, 3)]
    with pytest.raises(ConfigError, match="toy-brt is not a toy model; nearest: toy-bert"):
        resolve({"family": "toy", "name": "toy-brt", "steps": "all"}, toy_root=tmp_path, toy_specs=TOY)
    with pytest.raises(ConfigError, match="step 20 is not in the steps of toy model toy-bert; nearest: 16, 64"):
        resolve({"family": "toy", "name": "toy-bert", "steps": [20]}, toy_root=tmp_path, toy_specs=TOY)
    with pytest.raises(ConfigError, match="no toy_root"):
        resolve({"family": "toy", "name": "toy-bert", "steps": "all"}, toy_specs=TOY)


# ---------------------------------------------------------------------------------------------- whole config


def test_resolve_all_and_tokens_per_step(tmp_path):
    models = [
        {"family": "pythia", "name": "pythia-70m", "steps": [0, 1000]},
        {"family": "pythia", "name": "pythia-70m", "steps": [1000, 2000]},
        {"family": "multiberts", "name": "seed_0", "steps": {"start": 0, "stop": 40000, "every": 20000}},
        {"family": "toy", "name": "toy-bert", "steps": "all"},
    ]
    cks = resolve_all(models, toy_root=tmp_path, toy_specs=TOY)
    assert [c.key for c in cks][:5] == [
        "pythia/pythia-70m/step0",
        "pythia/pythia-70m/step1000",
        "pythia/pythia-70m/step2000",
        "multiberts/seed_0/step0",
        "multiberts/seed_0/step20000",
    ]
    assert len(cks) == 3 + 3 + 3
    assert Checkpoint.from_dict(cks[0].to_dict()) == cks[0]
    clash = [
        {"family": "multiberts", "name": "seed_0", "steps": [2_000_000]},
        {"family": "multiberts", "name": "seed_0", "steps": "final"},
    ]
    with pytest.raises(ConfigError, match="listed twice with different sources"):
        resolve_all(clash)
    assert tokens_per_step("pythia") == 2_097_152 and tokens_per_step("multiberts") == 131_072
    assert tokens_per_step("local") is None
    with pytest.raises(ConfigError, match="nearest: multiberts"):
        tokens_per_step("multibert")


# ---------------------------------------------------------------------------------------------- other Hub suites


def test_other_suite_grids_are_the_published_lists():
    """Counts and ends of each published list (docs/hub.md names the sources), and tokens per step."""
    assert len(grids.OLMO_1B_STEPS) == 351 and grids.OLMO_1B_STEPS[:3] == (1000, 2000, 3000)
    assert grids.OLMO_1B_STEPS[-2:] == (738000, 738020)
    assert len(grids.OLMO2_0425_1B_STEPS) == 195 and grids.OLMO2_0425_1B_STEPS[:4] == (0, 300, 10000, 20000)
    assert grids.OLMO2_0425_1B_STEPS[-1] == 1907359
    assert len(grids.MISTRAL_STEPS) == 609 and grids.MISTRAL_STEPS[-1] == 400000
    assert {10, 150, 2100, 21000} <= set(grids.MISTRAL_STEPS) and 160 not in grids.MISTRAL_STEPS
    for grid in (grids.OLMO_1B_STEPS, grids.OLMO2_0425_1B_STEPS, grids.MISTRAL_STEPS):
        assert list(grid) == sorted(set(grid))
    assert [tokens_per_step(f) for f in ("olmo", "olmo2", "gpt2", "tinyllama")] == [
        4_194_304,
        2_097_152,
        524_288,
        2_097_152,
    ]


@pytest.mark.parametrize(
    ("entry", "key", "repo", "revision", "tokens", "seed"),
    [
        (
            {"family": "olmo", "name": "OLMo-1B-hf", "steps": [738020]},
            "olmo/OLMo-1B-hf/step738020",
            "allenai/OLMo-1B-hf",
            "step738020-tokens*B",
            738020 * 4_194_304,
            6198,
        ),
        (
            {"family": "olmo2", "name": "OLMo-2-0425-1B", "steps": [23100]},
            "olmo2/OLMo-2-0425-1B/step23100",
            "allenai/OLMo-2-0425-1B",
            "stage1-step23100-tokens*B",
            23100 * 2_097_152,
            6198,
        ),
        (
            {"family": "gpt2", "name": "durin-gpt2-medium-x343", "steps": [150]},
            "gpt2/durin-gpt2-medium-x343/step150",
            "stanford-crfm/durin-gpt2-medium-x343",
            "checkpoint-150",
            150 * 524_288,
            343,
        ),
        (
            {"family": "tinyllama", "name": "TinyLlama-1.1B", "steps": "final"},
            "tinyllama/TinyLlama-1.1B/step1431000",
            "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
            "main",
            1_431_000 * 2_097_152,
            None,
        ),
    ],
)
def test_other_suites_resolve_to_repo_and_revision(entry, key, repo, revision, tokens, seed):
    (ckpt,) = resolve(entry)
    assert (ckpt.key, ckpt.repo_id, ckpt.revision, ckpt.tokens_seen, ckpt.seed) == (key, repo, revision, tokens, seed)


def test_tinyllama_repositories_are_the_readme_ones():
    ckpts = resolve({"family": "tinyllama", "name": "TinyLlama-1.1B", "steps": "all"})
    assert [c.step for c in ckpts] == [50_000, 240_000, 480_000, 715_000, 955_000, 1_195_000, 1_431_000]
    assert ckpts[0].repo_id == "PY007/TinyLlama-1.1B-step-50K-105b"
    assert all(c.revision == "main" for c in ckpts)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"family": "olmo", "name": "OLMo-1B-hf", "steps": [6000]},
            "step 6000 is not in the olmo grid; nearest: 5000, 10000",
        ),
        (
            {"family": "olmo", "name": "OLMo-1B", "steps": [1000]},
            "OLMo-1B is not one of the OLMo models; nearest: OLMo-1B-hf",
        ),
        ({"family": "olmo2", "name": "OLMo-2-0425-1B", "steps": [25000]}, "nearest: 23100, 30000"),
        ({"family": "gpt2", "name": "alias-gpt2-small-x22", "steps": [0]}, "nearest: alias-gpt2-small-x21"),
        ({"family": "gpt2", "name": "alias-gpt2-small-x21", "steps": [160]}, "nearest: 150, 200"),
        ({"family": "tinyllama", "name": "TinyLlama-1.1B", "steps": [500_000]}, "nearest: 480000, 715000"),
        ({"family": "olmo3", "name": "x", "steps": [0]}, "family 'olmo3' is unknown; nearest: olmo"),
        ({"family": "olmo", "name": "OLMo-1B-hf", "steps": [1000], "tokens_per_step": 5}, "fixed at 4194304"),
    ],
)
def test_other_suites_reject_unknown_names_and_steps(entry, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        resolve(entry)


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("family", "name", "shape"),
    [
        ("pythia", "pythia-14m", (128, 6, 4)),
        ("pythia", "pythia-70m-deduped", (512, 6, 8)),
        ("pythia", "pythia-410m-seed3", (1024, 24, 16)),
        ("pythia", "pythia-1b", (2048, 16, 8)),
        ("pythia", "pythia-12b", (5120, 36, 40)),
        ("multiberts", "seed_7", (768, 12, 12)),
        ("olmo", "OLMo-1B-hf", (2048, 16, 16)),
        ("olmo2", "OLMo-2-0425-1B", (2048, 16, 16)),
        ("gpt2", "alias-gpt2-small-x21", (768, 12, 12)),
        ("gpt2", "arwen-gpt2-medium-x21", (1024, 24, 16)),
        ("tinyllama", "TinyLlama-1.1B", (2048, 22, 32)),
    ],
)
def test_every_hub_model_has_its_config_json_shape(family, name, shape):
    """hidden_size, num_hidden_layers, num_attention_heads (GPT-2: n_embd, n_layer, n_head) of the models'
    config.json: what gradients.rank and qk_svd.heads are checked against before any download."""
    from anisweep.checkpoints.catalogue import FAMILIES, model_shape

    ckpt = resolve({"family": family, "name": name, "steps": "final"})[0]
    assert tuple(model_shape(ckpt)) == shape
    cls = FAMILIES[family]
    names = cls.names() if hasattr(cls, "names") else []
    assert all(model_shape(resolve({"family": family, "name": n, "steps": "final"})[0]) for n in names)


def test_a_local_runs_shape_is_its_config_json(tmp_path):
    from anisweep.checkpoints.catalogue import model_shape

    (tmp_path / "step1").mkdir()
    (tmp_path / "step1" / "config.json").write_text(json.dumps({"n_embd": 48, "n_layer": 3, "n_head": 6}))
    ckpt = resolve({"family": "local", "name": "run", "path": str(tmp_path), "steps": "all"})[0]
    assert tuple(model_shape(ckpt)) == (48, 3, 6)
    (tmp_path / "step1" / "config.json").write_text("{")
    assert model_shape(ckpt) is None  # fetch names the unreadable file
