"""Two Snakemake runs in one directory: a failing one leaves the other's weights alone (docs/reruns.md).

A first run, still going, has fetched the weights of a checkpoint it is about to extract; a second run with
other targets fails. Its `onerror` handler removes the weights the second run fetched, and no others: not
those the first run has locked (its lock file in `.snakemake/locks`), nor weights that no job of the second
run fetched. The first run is stood in by what it leaves on disk while it runs: its weights folder and its
lock files, as Snakemake writes them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import snakemake_command

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
NEOX = "toy/toy-neox"

# a toy trained, then a failing Snakemake run; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]


def snakemake(workdir: Path, configfile: Path, *args: str) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def weights_on_disk(workdir: Path) -> list[str]:
    weights = workdir / "weights"
    return sorted(p.relative_to(weights).as_posix() for p in weights.glob("*/*/step*") if any(p.iterdir()))


def test_a_failing_run_removes_only_the_weights_it_fetched(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    configfile = tmp_path / "sweep.yaml"
    config = {
        **TINY,
        "models": [{"family": "toy", "name": "toy-neox", "steps": "all"}],
        "toy": {"toy-neox": TINY["toy"]["toy-neox"]},
        "gradients": {"enabled": False},
    }
    configfile.write_text(yaml.safe_dump(config))
    done = snakemake(workdir, configfile, f"resources/{NEOX}", "resources/corpus.parquet")  # as the first run did
    assert done.returncode == 0, done.stderr[-3000:]
    # step 0's weights are fetched whole (fetch checks config.json and the tokenizer) and fail in extract
    safetensors = workdir / "resources" / NEOX / "step0" / "model.safetensors"
    safetensors.write_bytes(safetensors.read_bytes()[:1000])

    # The first run, still going: it has fetched step 8 and locked it (Snakemake's lock files, a path a line);
    # step 32's weights are on disk too, from a run that is no concern of the second one.
    for step in (8, 32):
        (workdir / "weights" / NEOX / f"step{step}").mkdir(parents=True)
        (workdir / "weights" / NEOX / f"step{step}" / "model.safetensors").write_bytes(b"weights")
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text(f"weights/{NEOX}/step8\nresources/corpus.parquet\n")
    (locks / "0.output.lock").write_text(f"results/{NEOX}/step8/extract.json\n")

    second = snakemake(workdir, configfile, f"results/{NEOX}/step0/extract.json")
    output = second.stdout + second.stderr
    assert second.returncode != 0, output[-3000:]
    assert "SafetensorError" in (workdir / "logs" / "extract" / NEOX / "step0.log").read_text(), output[-3000:]
    # what it fetched goes (its own lock, 1.input.lock, names step 0 and does not count); the rest stays
    assert weights_on_disk(workdir) == [f"{NEOX}/step32", f"{NEOX}/step8"], output[-3000:]
    assert "removed the weights of toy/toy-neox/step0 (not extracted)" in output
    assert "step8" not in output and "step32" not in output
