"""Local runs whose auxiliary analyses cannot run, swept through the workflow: a BERT saved without its MLM head
(`BertModel`, as a sentence-embedding model is saved) and a BERT whose tokenizer has no mask token. Every checkpoint
keeps its tables, metrics and figures (no step missing); the circuits read what the tensors allow; the logit lens
writes its one row with the reason, and its figure says it."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml
from transformers import AutoTokenizer, BertForPreTraining, PreTrainedTokenizerFast

from conftest import snakemake_command
from hubcache import save_tiny_bert

pytestmark = pytest.mark.usefixtures("shared_worker")  # the Snakemake runs share one warm worker

SENTENCES = [  # the words the tiny WordPiece vocabulary was built from (tests/hubcache.py)
    "the cat sat on the mat and the dog sat on the log",
    "a model of the world is a map of the territory",
    "attention is all you need said the paper in 2017",
]
EXTRACT = {"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 64, "device": "cpu", "seed": 0}
STEPS = (1, 2)


def bert_run(root: Path, *, headless: bool = False, mask_token: bool = True) -> Path:
    """A run folder step1/, step2/ of tiny BERTs (other seeds, so that no step repeats another's bytes), its
    tokenizer in the run folder: the BertModel alone, or the tokenizer without a mask token."""
    run = root / ("headless" if headless else "nomask")
    for step in STEPS:
        full = save_tiny_bert(root / "models" / f"{run.name}{step}", seed=step, safetensors=True)
        model = BertForPreTraining.from_pretrained(full)
        (model.bert if headless else model).save_pretrained(run / f"step{step}")
    tokenizer = AutoTokenizer.from_pretrained(str(full))
    if not mask_token:
        specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, **specials)
    tokenizer.save_pretrained(run)
    return run


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unmeasurable")
    runs = [bert_run(root, headless=True), bert_run(root, mask_token=False)]
    corpus = root / "eval.txt"
    corpus.write_text("\n\n".join(" ".join(SENTENCES * 4) for _ in range(40)) + "\n")
    config = {
        "models": [{"family": "local", "name": run.name, "path": str(run), "steps": "all"} for run in runs],
        "corpus": {"source": "text", "paths": [str(corpus)]},
        "extract": EXTRACT,
        "resources": {"extract_threads": 1},
    }
    configfile = root / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    workdir = root / "work"
    targets = [
        f"results/local/{run.name}/{name}"
        for run in runs
        for name in ("sweep.parquet", "figures/logit_lens.png", "figures/ov_circuits.png", "figures/isotropy.png")
    ]
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *targets)
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-6000:]
    return workdir


def sweep(workdir: Path, run: str) -> pl.DataFrame:
    return pl.read_parquet(workdir / "results" / "local" / run / "sweep.parquet")


def lens_rows(sweep: pl.DataFrame) -> pl.DataFrame:
    return sweep.filter(pl.col("measure") == "logit_lens")


@pytest.mark.slow  # Snakemake sweeps two local runs
@pytest.mark.parametrize("run", ["headless", "nomask"])
def test_every_checkpoint_keeps_its_metrics_and_figures(swept, run):
    rows = sweep(swept, run)
    assert "missing" not in set(rows["status"]) and sorted(rows["step"].unique()) == list(STEPS)
    core = rows.filter(~pl.col("measure").is_in(["circuits", "logit_lens"]))
    assert core.filter(pl.col("status") == "ok").height > 0.9 * core.height  # the table measures as for any BERT
    for step in STEPS:
        avg_cos = rows.filter((pl.col("step") == step) & (pl.col("metric") == "avg_cos") & (pl.col("site") == "resid"))
        assert avg_cos.height == 3 and (avg_cos["status"] == "ok").all()
    for figure in ("logit_lens.png", "ov_circuits.png", "isotropy.png"):
        assert (swept / "results" / "local" / run / "figures" / figure).stat().st_size > 5_000


@pytest.mark.slow
def test_a_bert_saved_without_its_head_has_circuits_and_says_why_it_has_no_lens(swept):
    rows = sweep(swept, "headless")
    circuits = rows.filter(pl.col("measure") == "circuits")
    saved = circuits.filter(pl.col("metric") == "head_saved")
    assert saved["value"].to_list() == [0.0, 0.0] and (saved["status"] == "ok").all()
    per_head = circuits.filter(pl.col("metric") == "ov_copying")
    assert per_head.height == len(STEPS) * 2 * 4 and (per_head["status"] == "ok").all()
    lens = lens_rows(rows)
    assert lens.select("step", "metric", "status").rows() == [(s, "logit_lens", "nan") for s in STEPS]
    assert all(math.isnan(v) for v in lens["value"])
    assert all(r.startswith("bert: the checkpoint was saved without its MLM head") for r in lens["reason"])


@pytest.mark.slow
def test_an_encoder_without_a_mask_token_says_why_it_has_no_lens(swept):
    rows = sweep(swept, "nomask")
    assert rows.filter(pl.col("metric") == "head_saved")["value"].to_list() == [1.0, 1.0]
    lens = lens_rows(rows)
    assert lens.select("step", "metric", "status").rows() == [(s, "logit_lens", "nan") for s in STEPS]
    assert all(r.startswith("the tokenizer has no mask token") for r in lens["reason"])
    assert all("extract" not in r.split(":")[0] for r in lens["reason"])
