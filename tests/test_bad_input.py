"""Bad input stops before any weights move, with a message that names what to change; no wrong table is
ever written as `ok`. Each case as a user meets it: the CLI the rules call, or snakemake on a config."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from anisweep import cli
from anisweep.checkpoints.config_checks import check_local_runs
from anisweep.checkpoints.hub import Pythia
from anisweep.config import checkpoints, complete
from anisweep.corpus import write_texts
from anisweep.errors import ConfigError

from conftest import snakemake_command
from hubcache import build_hub_cache, offline_hub, save_tiny_bert, save_tiny_pythia

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "the cat sat on the mat and the dog sat on the log",
    "a model of the world is a map of the territory",
    "attention is all you need said the paper in 2017",
]
# The tiny models have hidden size 32 and 64 positions (tests/hubcache.py).
EXTRACT = {"n_sequences": 4, "seq_len": 16, "batch_size": 2, "sample_tokens": 64, "device": "cpu"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    return {"bert": save_tiny_bert(root / "bert"), "pythia": save_tiny_pythia(root / "pythia"), "root": root}


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.parquet"
    write_texts([" ".join(SENTENCES * 3)] * 20, path)
    return path


def local_run_without_tokenizer(models, tmp_path, kind="bert") -> Path:
    """A run folder step1/ with config.json and weights only, as a bare training loop saves them."""
    step = tmp_path / f"run-{kind}" / "step1"
    step.mkdir(parents=True)
    for f in models[kind].iterdir():
        if f.name in ("config.json", "pytorch_model.bin", "model.safetensors"):
            shutil.copy(f, step / f.name)
    return step.parent


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip().splitlines()[-1] if code else ""


def fetch_args(checkpoint: dict, out: Path, texts: Path, **settings) -> list:
    return [
        "fetch",
        "--checkpoint",
        json.dumps(checkpoint),
        "--out",
        out,
        "--texts",
        texts,
        "--settings",
        json.dumps({**EXTRACT, **settings}),
    ]


def local_checkpoint(run: Path, **extra) -> dict:
    ckpt = checkpoints({"models": [{"family": "local", "name": "run", "path": str(run), "steps": [1], **extra}]})[0]
    return ckpt.to_dict()


# ---------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("kind", ["bert", "pythia"])
def test_a_local_run_without_a_tokenizer_stops_before_its_weights_are_read(
    models, tmp_path, texts, capsys, monkeypatch, kind
):
    from anisweep.checkpoints import weight_files

    monkeypatch.setattr(weight_files, "hash_weight_files", lambda *a: pytest.fail("the weights were read"))
    run = local_run_without_tokenizer(models, tmp_path, kind)
    out = tmp_path / "weights"
    code, line = run_cli(capsys, *fetch_args(local_checkpoint(run), out, texts))
    assert code == 1
    assert "local/run/step1: PreflightError: " in line and f"no tokenizer files in {run / 'step1'}" in line
    assert "tokenizer: <folder or Hub id>" in line
    assert not (out / "checkpoint.json").exists()


def test_the_config_may_name_the_tokenizer_of_a_run_that_has_none(models, tmp_path, texts, capsys):
    run = local_run_without_tokenizer(models, tmp_path)
    out = tmp_path / "weights"
    code, _ = run_cli(capsys, *fetch_args(local_checkpoint(run, tokenizer=str(models["bert"])), out, texts))
    assert code == 0
    manifest = json.loads((out / "checkpoint.json").read_text())
    assert manifest["tokenizer_path"] == str(models["bert"])
    results = tmp_path / "results"
    code, _ = run_cli(
        capsys,
        "extract",
        "--manifest",
        out / "checkpoint.json",
        "--texts",
        texts,
        "--settings",
        json.dumps(EXTRACT),
        "--out",
        results,
    )
    assert code == 0
    info = json.loads((results / "extract.json").read_text())
    assert info["n_valid_tokens"] == EXTRACT["n_sequences"] * EXTRACT["seq_len"]


def test_extract_by_hand_without_a_tokenizer_is_an_error_not_unknown_tokens(models, tmp_path, texts, capsys):
    run = local_run_without_tokenizer(models, tmp_path)
    manifest = tmp_path / "checkpoint.json"
    manifest.write_text(
        json.dumps(
            {
                "family": "local",
                "model": "run",
                "step": 1,
                "seed": None,
                "tokens_seen": None,
                "path": str(run / "step1"),
                "tokenizer_path": None,
            }
        )
    )
    code, line = run_cli(
        capsys,
        "extract",
        "--manifest",
        manifest,
        "--texts",
        texts,
        "--settings",
        json.dumps(EXTRACT),
        "--out",
        tmp_path / "results",
    )
    assert code == 1 and "no tokenizer files" in line
    assert not (tmp_path / "results" / "qk.parquet").exists()


# ---------------------------------------------------------------------------------------------- model limits


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"seq_len": 80}, "extract.seq_len = 80 is longer than the 64 positions"),
        ({"sample_tokens": 16}, "extract.sample_tokens = 16 keeps fewer hidden-state samples than d_model = 32"),
        ({"n_sequences": 1, "seq_len": 16, "sample_tokens": 4096}, "the evaluation batch (n_sequences x seq_len = 16"),
        ({"n_sequences": 500}, "evaluation corpus too short"),
    ],
    ids=["seq-len-above-positions", "sample-below-d-model", "batch-below-d-model", "corpus-too-short"],
)
def test_hub_checkpoint_checks_come_before_the_weights_download(
    models, tmp_path, texts, capsys, monkeypatch, settings, named
):
    """The weights are only on the (unreachable) Hub, not in the cache: had fetch asked for them first, the
    error would be a download error, not the check's."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    pythia = models["pythia"]
    weights = {"model.safetensors": (pythia / "model.safetensors").read_bytes()}
    small = tmp_path / "small"
    shutil.copytree(pythia, small, ignore=shutil.ignore_patterns("model.safetensors"))
    build_hub_cache(hf_home, "EleutherAI/pythia-70m", {"step1000": small}, remote_only=weights)
    out = tmp_path / "weights"
    checkpoint = Pythia.checkpoint("pythia-70m", 1000).to_dict()
    code, line = run_cli(capsys, *fetch_args(checkpoint, out, texts, **settings))
    assert code == 1
    assert line.startswith("pythia/pythia-70m/step1000: PreflightError: ") and named in line, line
    assert not (out / "checkpoint.json").exists()
    assert not list(out.rglob("*.safetensors"))


def test_hub_checkpoint_that_passes_the_checks_is_then_downloaded(models, tmp_path, texts, capsys, monkeypatch):
    """The control of the test above: the same cache with the weights in it fetches."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    build_hub_cache(hf_home, "EleutherAI/pythia-70m", {"step1000": models["pythia"]})
    out = tmp_path / "weights"
    code, _ = run_cli(capsys, *fetch_args(Pythia.checkpoint("pythia-70m", 1000).to_dict(), out, texts))
    assert code == 0 and (out / "checkpoint.json").exists()


# ---------------------------------------------------------------------------------------------- device


def test_a_missing_gpu_is_named_with_the_machine_and_what_to_change(models, tmp_path, texts, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error cannot happen here")
    manifest = tmp_path / "checkpoint.json"
    manifest.write_text(
        json.dumps(
            {
                "family": "local",
                "model": "run",
                "step": 1,
                "seed": None,
                "tokens_seen": None,
                "path": str(models["bert"]),
                "tokenizer_path": str(models["bert"]),
            }
        )
    )
    code, line = run_cli(
        capsys,
        "extract",
        "--manifest",
        manifest,
        "--texts",
        texts,
        "--settings",
        json.dumps({**EXTRACT, "device": "cuda"}),
        "--out",
        tmp_path / "results",
    )
    assert code == 1
    assert f"torch sees no GPU on {socket.gethostname()}" in line and "extract.device: auto" in line
    assert not (tmp_path / "results" / "qk.parquet").exists()


# ---------------------------------------------------------------------------------------------- the config


def tiny_config() -> dict:
    return yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())


def test_two_local_runs_under_one_name_are_an_error_naming_both(models, tmp_path):
    runs = []
    for i in range(2):
        run = tmp_path / f"run{i}"
        shutil.copytree(models["bert"], run / "step1")
        runs.append(run)
    config = {"models": [{"family": "local", "name": "run", "path": str(r), "steps": [1]} for r in runs]}
    with pytest.raises(ConfigError, match="local/run/step1 is listed twice with different sources") as error:
        checkpoints(complete(config))
    assert str(runs[0] / "step1") in str(error.value) and str(runs[1] / "step1") in str(error.value)


def test_two_entries_of_one_toy_are_an_error_naming_both_and_their_union(models):
    config = tiny_config()
    config["models"] = [
        {"family": "toy", "name": "toy-bert", "steps": [0, 8]},
        {"family": "toy", "name": "toy-neox", "steps": "all"},
        {"family": "toy", "name": "toy-bert", "steps": [32]},
    ]
    with pytest.raises(ConfigError) as error:
        checkpoints(complete(config))
    message = str(error.value)
    assert "two entries name the toy model 'toy-bert'" in message
    assert "models[0] {'family': 'toy', 'name': 'toy-bert', 'steps': [0, 8]}" in message
    assert "models[2] {'family': 'toy', 'name': 'toy-bert', 'steps': [32]}" in message
    assert message.endswith("write one entry with the union of their steps, steps: [0, 8, 32]")


def test_two_entries_of_one_local_run_are_an_error_naming_both(models, tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(models["bert"], run / f"step{step}")
    entry = {"family": "local", "name": "run", "path": str(run)}
    with pytest.raises(ConfigError, match=r"union of their steps, steps: \[1, 2\]") as error:
        checkpoints(complete({"models": [{**entry, "steps": [1]}, {**entry, "steps": "all"}]}))
    assert "models[0]" in str(error.value) and "models[1]" in str(error.value)
    other = tmp_path / "other"
    shutil.copytree(models["bert"], other / "step2")
    two_runs = [{**entry, "steps": [1]}, {**entry, "path": str(other), "steps": [2]}]
    with pytest.raises(ConfigError, match="with different settings: .* give one entry another name") as error:
        checkpoints(complete({"models": two_runs}))
    assert str(run) in str(error.value) and str(other) in str(error.value)


def local_entry(run: Path, steps="all") -> dict:
    return {"family": "local", "name": "run", "path": str(run), "steps": steps}


def mixed_run(models, tmp_path) -> Path:
    """A local run whose steps 0 and 64 are GPT-NeoX and whose step 1000 is a BERT."""
    run = tmp_path / "mixed"
    for step, kind in ((0, "pythia"), (64, "pythia"), (1000, "bert")):
        shutil.copytree(models[kind], run / f"step{step}")
    return run


def test_a_local_run_of_two_architectures_is_an_error_naming_the_step_and_both(models, tmp_path):
    run = mixed_run(models, tmp_path)
    config = complete({"models": [local_entry(run)], "extract": EXTRACT})
    with pytest.raises(ConfigError) as error:
        check_local_runs(checkpoints(config), config)
    message = str(error.value)
    assert message.startswith(
        "local/run: step 1000 is bert (BertForPreTraining), but steps 0, 64 are gpt_neox (GPTNeoXForCausalLM): "
    ), message
    assert f"out of {run}" in message
    one_model = complete({**config, "models": [local_entry(run, [0, 64])]})
    check_local_runs(checkpoints(one_model), one_model)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"seq_len": 80}, "local/run/step1: extract.seq_len = 80 is longer than the 64 positions the model has"),
        ({"sample_tokens": 16}, "local/run/step1: extract.sample_tokens = 16 keeps fewer hidden-state samples"),
    ],
    ids=["seq-len-above-positions", "sample-below-d-model"],
)
def test_a_local_runs_config_json_is_checked_against_the_extract_settings_when_the_config_is_read(
    models, tmp_path, settings, named
):
    run = local_run_without_tokenizer(models, tmp_path)
    config = complete({"models": [local_entry(run)], "extract": EXTRACT})
    check_local_runs(checkpoints(config), config)
    config = complete({**config, "extract": {**EXTRACT, **settings}})
    with pytest.raises(ConfigError, match=re.escape(named)):
        check_local_runs(checkpoints(config), config)


def test_a_config_of_models_alone_gets_every_default(models, tmp_path):
    config = complete({"models": [{"family": "local", "name": "run", "path": str(models["root"]), "steps": "all"}]})
    media = {"modality": "text", "max_items": 512, "seed": 0, "resample": False, "max_seconds": 10.0}
    assert config["corpus"] == {"source": "builtin", **media}  # the image and audio keys a text corpus does not read
    assert config["extract"]["device"] == "auto" and config["extract"]["sample_tokens"] == 4096
    assert config["fetch"] == {"keep_weights": False, "retries": 5} and config["resources"] == {"extract_threads": 2}


def snakemake(workdir: Path, config: dict, *args: str) -> subprocess.CompletedProcess:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = snakemake_command(workdir, "--configfile", str(path), "--cores", "1", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def toy_change(key, value):
    return lambda c: c["toy"]["toy-bert"].update({key: value})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (toy_change("d_modle", 32), "'d_modle' was unexpected"),
        (lambda c: c["extract"].update(seq_len=64), "extract.seq_len = 64 is longer than the 32 positions"),
        (lambda c: c["extract"].update(sample_tokens=8), "fewer hidden-state samples than d_model = 32"),
        (
            lambda c: c["models"].append({"family": "local", "name": "toy-bert", "path": "x", "steps": "all"}),
            "path x is not a folder",
        ),
        (lambda c: c["gradients"].update(rank=[4, 32]), "gradients.rank 32 is not less than d_model = 32 of toy/"),
        (
            lambda c: c["extract"].update(score_bins={"low": 20, "high": -20, "n": 80}),
            "extract.score_bins: low = 20 is not below high = -20",
        ),
    ],
    ids=[
        "misspelt-toy-key",
        "seq-len-above-toy-positions",
        "sample-below-toy-d-model",
        "local-path-missing",
        "rank-of-d-model",
        "score-bins-reversed",
    ],
)
def test_config_errors_stop_snakemake_before_any_job(tmp_path, change, named):
    config = tiny_config()
    change(config)
    done = snakemake(tmp_path, config)
    assert done.returncode != 0 and named in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "resources").exists() and not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "settings", "named"),
    [
        ("mixed", {}, "local/run: step 1000 is bert (BertForPreTraining), but steps 0, 64 are gpt_neox"),
        ("pythia", {"seq_len": 80}, "local/run/step1: extract.seq_len = 80 is longer than the 64 positions"),
    ],
    ids=["two-architectures", "seq-len-above-positions"],
)
def test_a_local_runs_config_errors_stop_snakemake_before_any_job(models, tmp_path, kind, settings, named):
    """Before these were read with the config, the weights job (which needs no fetch) ran first and failed on
    something else, or the run's steps were swept as one model."""
    run = mixed_run(models, tmp_path) if kind == "mixed" else local_run_without_tokenizer(models, tmp_path, kind)
    config = {
        "models": [local_entry(run)],
        "extract": {**EXTRACT, **settings},
    }
    work = tmp_path / "work"
    work.mkdir()
    done = snakemake(work, config)
    assert done.returncode != 0 and named in done.stderr, done.stderr[-2000:]
    assert not any((work / name).exists() for name in ("logs", "results", "resources", "weights"))


@pytest.mark.slow
def test_cuda_on_a_machine_without_one_stops_a_local_run_before_any_job(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error cannot happen here")
    config = tiny_config()
    config["extract"]["device"] = "cuda"
    done = snakemake(tmp_path, config)
    assert done.returncode != 0 and f"torch sees no GPU on {socket.gethostname()}" in done.stderr
    assert not (tmp_path / "resources").exists()
    assert snakemake(tmp_path, config, "-n").returncode == 0  # a dry run, e.g. before a cluster submission


# ---------------------------------------------------------------------------------------------- full disk


def test_a_full_disk_is_named_as_such_and_leaves_no_half_written_file(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from anisweep import atomic

    def full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_fsync", full)
    out = tmp_path / "resources" / "corpus.parquet"
    code, line = run_cli(capsys, "corpus", "--corpus", json.dumps({"source": "builtin"}), "--out", out)
    assert code == 1
    assert line.startswith("OSError: ") and f"the disk holding {out} is full or over quota" in line, line
    assert list(out.parent.iterdir()) == []


def test_a_writer_that_hides_the_os_error_is_still_named_a_full_disk(tmp_path, capsys, monkeypatch):
    """polars reports ENOSPC as a ComputeError ("underlying IO error: No space left on device (os error 28)")."""
    import polars as pl

    def full(self, path, **kwargs):
        raise pl.exceptions.ComputeError("parquet: underlying IO error: No space left on device (os error 28)")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    out = tmp_path / "resources" / "corpus.parquet"
    code, line = run_cli(capsys, "corpus", "--corpus", json.dumps({"source": "builtin"}), "--out", out)
    assert code == 1 and f"the disk holding {out} is full or over quota" in line, line
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("hub", [True, False])
def test_a_full_disk_in_extract_frees_the_downloaded_weights_never_a_local_run(
    tmp_path, texts, capsys, monkeypatch, hub
):
    import errno
    import os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "results/x/qk.parquet")

    from anisweep.extract import run as extract_run

    monkeypatch.setattr(extract_run, "extract_checkpoint", full)
    folder = tmp_path / "weights" / "pythia" / "pythia-70m" / "step1000"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    manifest = {
        "family": "pythia",
        "model": "pythia-70m",
        "step": 1000,
        "path": str(folder),
        "repo_id": "EleutherAI/pythia-70m" if hub else None,
    }
    (folder / "checkpoint.json").write_text(json.dumps(manifest))
    code, line = run_cli(
        capsys, "extract", "--manifest", folder / "checkpoint.json", "--texts", texts, "--out", tmp_path / "results"
    )
    assert code == 1 and "is full or over quota" in line
    assert folder.exists() is not hub


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"seq_len": 80}, "extract.seq_len = 80 is longer than the 64 positions the model has (n_positions)"),
        ({"sample_tokens": 16}, "keeps fewer hidden-state samples than d_model = 32"),
    ],
)
def test_gpt2_positions_and_width_are_read_from_its_own_config_keys(settings, expected):
    """GPT-2's config names its positions n_positions and its width n_embd."""
    from types import SimpleNamespace

    from anisweep.checkpoints.preflight import PreflightError, check_model_config

    hf_config = {"model_type": "gpt2", "n_positions": 64, "n_embd": 32}
    with pytest.raises(PreflightError, match=re.escape(expected)):
        check_model_config(hf_config, SimpleNamespace(**{**EXTRACT, **settings}), "gpt2/m/step0")


# ---------------------------------------------------------------------------------------------- model shapes


def test_a_local_runs_shape_is_read_from_its_config_json_when_the_config_is(models, tmp_path):
    """The tiny run has hidden size 32, 2 layers and 4 heads: a rank of 32 makes every subspace the whole space,
    and head 4 does not exist; both stop the run before any job."""
    run = local_run_without_tokenizer(models, tmp_path)
    base = {"models": [{"family": "local", "name": "run", "path": str(run), "steps": [1]}]}
    with pytest.raises(ConfigError, match=r"gradients.rank 32 is not less than d_model = 32 of local/run"):
        checkpoints(complete({**base, "gradients": {"enabled": True, "rank": [8, 32]}}))
    with pytest.raises(ConfigError, match=re.escape("qk_svd.heads: [[0, 4]] are not [layer, head] pairs of local/run")):
        checkpoints(complete({**base, "qk_svd": {"heads": [[0, 4]]}}))
    assert checkpoints(complete({**base, "gradients": {"enabled": True, "rank": 31}, "qk_svd": {"heads": [[1, 3]]}}))


def test_a_tokenizer_larger_than_the_models_vocabulary_stops_before_its_weights_are_read(
    models, tmp_path, texts, capsys, monkeypatch
):
    """The BERT run has 79 embedding rows; the BPE tokenizer named for it has 300 tokens. Its ids failed with an
    IndexError inside extract, after the weights were hashed and loaded."""
    from anisweep.checkpoints import weight_files

    monkeypatch.setattr(weight_files, "hash_weight_files", lambda *a: pytest.fail("the weights were read"))
    run = local_run_without_tokenizer(models, tmp_path)
    out = tmp_path / "weights"
    checkpoint = local_checkpoint(run, tokenizer=str(models["pythia"]))
    code, line = run_cli(capsys, *fetch_args(checkpoint, out, texts))
    assert code == 1
    assert line.startswith("local/run/step1: PreflightError: the tokenizer ") and "(300 tokens)" in line, line
    assert "vocab_size = 79 rows" in line and "not this model's" in line and "tokenizer: <folder or Hub id>" in line
    assert not (out / "checkpoint.json").exists()


def test_a_corpus_the_tokenizer_cannot_read_stops_before_the_weights_move(models, tmp_path, capsys, monkeypatch):
    """Chinese text through an English WordPiece vocabulary is all [UNK]: the analysis would be of one token id."""
    from anisweep.checkpoints import weight_files

    monkeypatch.setattr(weight_files, "hash_weight_files", lambda *a: pytest.fail("the weights were read"))
    texts = tmp_path / "chinese.parquet"
    write_texts(["机器学习是人工智能的一个分支。它研究计算机如何从数据中学习。"] * 40, texts)
    out = tmp_path / "weights"
    checkpoint = local_checkpoint(local_run_without_tokenizer(models, tmp_path), tokenizer=str(models["bert"]))
    code, line = run_cli(capsys, *fetch_args(checkpoint, out, texts))
    assert code == 1
    assert re.match(r"local/run/step1: PreflightError: \d+\.\d% of the evaluation batch's 64 tokens are the", line)
    assert "unknown token '[UNK]'" in line and "机器学习" in line and "extract.max_unknown_token_share" in line
    assert not (out / "checkpoint.json").exists()


# ---------------------------------------------------------------------------------------------- damaged tables


def cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_table_cut_short_by_an_earlier_run_is_named_with_what_to_do(tmp_path):
    """polars says only `ComputeError: parquet: File out of specification: The file must end with PAR1`, and
    rerunning reads the same file again."""
    import polars as pl

    from anisweep.measures.metrics import checkpoint_metrics
    from anisweep.tables import DamagedTable, read_parquet

    folder = tmp_path / "results" / "toy" / "t" / "step0"
    folder.mkdir(parents=True)
    table = folder / "hidden_stats.parquet"  # the first table read: every model has one (a CNN has no q/k rows)
    pl.DataFrame({"layer": [0, 1]}).write_parquet(table)
    assert read_parquet(table)["layer"].to_list() == [0, 1]
    cut_short(table)
    with pytest.raises(DamagedTable) as error:
        checkpoint_metrics(folder)
    message = str(error.value)
    assert message.startswith(f"{table} is not a whole Parquet file (parquet: ") and "PAR1" in message
    assert f"Delete it (rm {table}) and rerun" in message and "(the extract rule makes it)" in message


@pytest.mark.parametrize("table", ["metrics", "sweep"])
def test_results_scan_names_a_damaged_table_before_anything_is_collected(tmp_path, table):
    import polars as pl

    from anisweep import results
    from anisweep.tables import DamagedTable

    step = tmp_path / "results" / "toy" / "t" / "step0"
    step.mkdir(parents=True)
    path = step / f"{table}.parquet" if table == "metrics" else step.parent / f"{table}.parquet"
    pl.DataFrame({"layer": [0], "step": [0]}).write_parquet(path)
    cut_short(path)
    with pytest.raises(DamagedTable, match=re.escape(f"Delete it (rm {path}) and rerun")):
        results.scan(tmp_path / "results", table)


def test_a_damaged_corpus_is_named_too(tmp_path):
    from anisweep.corpus import read_texts
    from anisweep.tables import DamagedTable

    path = tmp_path / "corpus.parquet"
    write_texts(SENTENCES, path)
    assert read_texts(path) == SENTENCES
    cut_short(path)
    with pytest.raises(DamagedTable, match=r"corpus.parquet is not a whole Parquet file.*the corpus rule makes it"):
        read_texts(path)
