"""A user's run analysed while it trains (AnisweepCallback) goes through the workflow as a `live: true` local
run: its steps are the callback's folders, nothing is fetched or extracted, and the metrics are the ones of
those folders."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import torch
import yaml
from transformers import GPTNeoXForCausalLM

from anisweep import config as anisweep_config
from anisweep.corpus import load_texts
from anisweep.errors import ConfigError
from anisweep.extract.model import ExtractSettings
from anisweep.live.callback import AnisweepCallback
from anisweep.live.take import take
from anisweep.measures.metrics import checkpoint_metrics
from anisweep.plots.sweep import MODEL_FIGURES
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import assert_tables_equal, neox_config, snakemake_command

pytestmark = pytest.mark.usefixtures("shared_worker")  # the Snakemake runs share one warm worker

ROOT = Path(__file__).resolve().parents[2]
STEPS = (0, 2, 4)
TOKENS_PER_STEP = 256


def _tiny() -> dict:
    tiny = anisweep_config.complete(yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text()))
    tiny["gradients"] |= {"steps": [0, 4], "subspaces": "per_checkpoint", "embedding_change": False}
    return tiny


def _train(results: Path, gradient_steps=STEPS) -> None:
    """A tiny GPT-NeoX trained by hand for 4 steps, the callback analysing steps 0, 2 and 4 into `results`."""
    tiny = _tiny()
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    torch.manual_seed(0)
    config = neox_config()
    config.vocab_size = len(tokenizer)
    model = GPTNeoXForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings, grads = ExtractSettings(**tiny["extract"]), GradientSettings(**tiny["gradients"])
    callbacks = {
        with_gradients: AnisweepCallback(
            STEPS,
            texts,
            tokenizer,
            "my-run",
            results,
            settings,
            grads if with_gradients else GradientSettings(enabled=False),
            TOKENS_PER_STEP,
        )  # fmt: skip
        for with_gradients in (True, False)
    }
    ids = callbacks[True].batch["input_ids"]
    for step in range(max(STEPS) + 1):
        if step:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        callback = callbacks[step in gradient_steps]
        callback.on_step_end(SimpleNamespace(seed=7), SimpleNamespace(global_step=step), None, model=model)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """A workdir whose results/local/my-run/step{0,2,4}/ the callback wrote (gradients at 0 and 4 only)."""
    workdir = tmp_path_factory.mktemp("live-local")
    _train(workdir / "results", gradient_steps=(0, 4))
    return workdir


def _config(entry: dict, **changes) -> dict:
    return anisweep_config.complete({**_tiny(), "models": [entry], **changes})


def _checkpoints(workdir: Path, entry: dict, **changes):
    config = _config(entry, **changes)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        return anisweep_config.checkpoints(config)


LIVE = {"family": "local", "name": "my-run", "live": True, "steps": "all"}


def test_the_steps_are_the_folders_the_callback_wrote(analysed):
    found = _checkpoints(analysed, LIVE)
    assert [c.step for c in found] == list(STEPS)
    assert [c.tokens_seen for c in found] == [s * TOKENS_PER_STEP for s in STEPS]
    assert {c.seed for c in found} == {7}
    assert found[1].path == str(Path("results/local/my-run/step2"))
    assert [c.step for c in _checkpoints(analysed, {**LIVE, "steps": "final"})] == [4]
    assert [c.step for c in _checkpoints(analysed, {**LIVE, "steps": [0, 4]})] == [0, 4]


def test_another_path_is_read_and_an_unfinished_step_is_left_out_of_all(analysed, tmp_path):
    run = tmp_path / "elsewhere"
    shutil.copytree(analysed / "results" / "local" / "my-run", run)
    (run / "step2" / "extract.json").unlink()  # the callback was still writing step 2
    (run / "step6").mkdir()
    found = _checkpoints(tmp_path, {**LIVE, "path": str(run)})
    assert [c.step for c in found] == [0, 4] and found[0].path == str(run / "step0")
    with pytest.raises(ConfigError, match=r"step2 lacks extract.json.*AnisweepCallback.*at step 2"):
        _checkpoints(tmp_path, {**LIVE, "path": str(run), "steps": [2, 4]})
    (run / "step4" / "qk.parquet").unlink()
    with pytest.raises(ConfigError, match=r"step4 lacks qk.parquet.*at step 4"):
        _checkpoints(tmp_path, {**LIVE, "path": str(run), "steps": [4]})
    with pytest.raises(ConfigError, match="not in|is not|no "):
        _checkpoints(tmp_path, {**LIVE, "path": str(run), "steps": [3]})


def test_a_run_not_analysed_yet_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"my-run.*results/local/my-run is not a folder.*AnisweepCallback"):
        _checkpoints(tmp_path, LIVE)
    (tmp_path / "results" / "local" / "my-run" / "step0").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds an extract.json"):
        _checkpoints(tmp_path, LIVE)


def test_a_gradient_step_without_gradients_is_a_config_error(analysed):
    with pytest.raises(ConfigError, match=r"step2 lack one of gradient_sums.parquet.*gradients.steps"):
        _checkpoints(analysed, LIVE, gradients={**_tiny()["gradients"], "steps": None})
    assert len(_checkpoints(analysed, LIVE, gradients={**_tiny()["gradients"], "enabled": False})) == 3


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"gradients": {"enabled": False}, "untrained": {"enabled": True, "inits": [{"model": "my-run"}]}},
            "untrained.inits",
        ),
    ],
)
def test_what_needs_saved_weights_is_refused_for_a_live_local_run(analysed, change, named):
    config = anisweep_config.complete(
        {**yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text()), "models": [LIVE], **change}
    )
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ConfigError, match=named) as error:
        mp.chdir(analysed)
        anisweep_config.checkpoints(config)
    assert "live local runs ['my-run']" in str(error.value) and "live: false" in str(error.value)


def test_take_checks_in_place_copies_from_elsewhere_and_names_what_is_missing(analysed, tmp_path):
    run = analysed / "results" / "local" / "my-run"
    take(run, 2, ["qk.parquet", "extract.json"], run / "step2", run="my-run")  # in place: a check
    take(run, 2, ["qk.parquet"], tmp_path / "out", run="my-run")
    assert (tmp_path / "out" / "qk.parquet").read_bytes() == (run / "step2" / "qk.parquet").read_bytes()
    with pytest.raises(
        FileNotFoundError, match=r"local/my-run/step2: .*step2 lacks gradient_sums.parquet \(the.*at step 2"
    ):
        take(run, 2, ["gradient_sums.parquet"], run / "step2", run="my-run")


@pytest.mark.slow  # the workflow twice on a live local run
def test_workflow_sweeps_a_live_local_run_without_weights_and_reruns_nothing(tmp_path):
    _train(tmp_path / "results", gradient_steps=(0, 4))
    config = {k: v for k, v in _tiny().items() if k not in ("toy", "untrained")}
    config |= {"models": [LIVE], "untrained": {"enabled": False}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "results" / "local" / "my-run"
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("step*/*") if p.is_file()}
    contents = {p: p.read_bytes() for p in before}
    # the tables and the figures asserted on below, not every figure of the DAG (test_workflow.py draws those)
    targets = [f"results/local/my-run/{path}" for path in ("sweep.parquet", "gradients_sweep.parquet")]
    targets += [f"results/local/my-run/figures/{name}" for name in MODEL_FIGURES]
    command = snakemake_command(tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", *targets)
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-4000:]
    for rule in ("fetch", "extract", "extract_live_local"):  # the shares (rule gradients) read the pass tables
        assert f"rule {rule}:" not in first.stderr, rule
    assert {p: p.stat().st_mtime_ns for p in before} == before  # the callback's files, untouched
    assert not (tmp_path / "weights").exists()
    for path in ("sweep.parquet", "gradients_sweep.parquet", *(f"figures/{name}" for name in MODEL_FIGURES)):
        assert (run_dir / path).is_file(), path
    for step in STEPS:
        gradients = run_dir / f"step{step}" / "gradients.parquet"
        expected = checkpoint_metrics(run_dir / f"step{step}", gradients if step in (0, 4) else None)
        metrics = pl.read_parquet(run_dir / f"step{step}" / "metrics.parquet")
        assert set(metrics["tokens_seen"].to_list()) == {step * TOKENS_PER_STEP}
        assert_tables_equal(metrics, expected, f"step{step}")
    sweep = pl.read_parquet(run_dir / "sweep.parquet")
    assert sorted(sweep["step"].unique().to_list()) == list(STEPS)
    assert set(pl.read_parquet(run_dir / "gradients_sweep.parquet")["step"].to_list()) == {0, 4}

    second = subprocess.run([*command, "--dry-run"], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "Nothing to be done" in second.stdout + second.stderr

    rules = ["extract_live_local"]
    forced = subprocess.run([*command, "--forcerun", *rules, "--until", *rules], capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr[-4000:]
    assert "rule extract_live_local:" in forced.stderr  # forced, it checks the files in place, deleting none
    assert {p: p.read_bytes() for p in before} == contents


@pytest.mark.slow  # the workflow once on a live local run written elsewhere
def test_a_step_the_callback_wrote_again_elsewhere_is_taken_again(tmp_path):
    """With `path:` elsewhere the callback's files are copied in; a step it writes again (new times) is taken
    again, and nothing else (docs/reruns.md: the step folder's content is a recorded param of the take)."""
    elsewhere = tmp_path / "elsewhere"
    _train(elsewhere, gradient_steps=(0, 4))
    config = {k: v for k, v in _tiny().items() if k not in ("toy", "untrained")}
    config |= {"models": [{**LIVE, "path": str(elsewhere / "local" / "my-run")}], "untrained": {"enabled": False}}
    config["gradients"] = {"enabled": False}  # the take is the point here; the test above runs the gradients
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    sweep = "results/local/my-run/sweep.parquet"  # what reads every step's take, without the figures
    command = snakemake_command(tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", sweep)
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "Nothing to be done" in subprocess.run([*command, "-n"], capture_output=True, text=True).stdout
    written = elsewhere / "local" / "my-run" / "step2" / "qk.parquet"
    stat = written.stat()
    os.utime(written, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the callback wrote step 2 again
    again = subprocess.run([*command, "-n"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-4000:]
    planned = again.stdout + again.stderr
    assert re.search(r"^extract_live_local\s+1$", planned, re.M), planned[-3000:]
    assert not re.search(r"^(fetch|extract)\s", planned, re.M)


def test_live_is_a_key_of_local_entries_only():
    from anisweep.checkpoints.catalogue import resolve

    with pytest.raises(ConfigError, match="key 'live' is not used for family pythia"):
        resolve({"family": "pythia", "name": "pythia-14m", "steps": [0], "live": True})
