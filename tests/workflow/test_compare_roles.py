"""compare_sweep's command names every role of every pair: a pair table in two roles gives compare.parquet its rows
in each (a dry run: the command as Snakemake would run it)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from conftest import snakemake_command
from warm_snakemake import dry_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_pair_that_is_the_previous_and_the_named_step_is_gathered_in_both_roles(tmp_path):
    config = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    config["compare"] = {"against": ["final", "previous", 0], "layer_steps": []}
    configfile = tmp_path / "roles.yaml"
    configfile.write_text(yaml.safe_dump(config))
    target = "results/toy/toy-bert/compare.parquet"
    command = snakemake_command(tmp_path, "--configfile", str(configfile), "-n", "--printshellcmds", target)
    done = dry_run(command)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if " -m anisweep compare-sweep " in line]
    assert len(lines) == 1, (done.stdout + done.stderr)[-3000:]
    words = shlex.split(lines[0].split(" 2> ")[0])
    pairs = sorted(w for w in words if "=results/" in w)
    folder = "results/toy/toy-bert"
    assert pairs == [
        f"final={folder}/step0/compare/toy-bert.step32.parquet",
        f"final={folder}/step8/compare/toy-bert.step32.parquet",
        f"previous={folder}/step32/compare/toy-bert.step8.parquet",
        f"previous={folder}/step8/compare/toy-bert.step0.parquet",
        f"step={folder}/step32/compare/toy-bert.step0.parquet",
        f"step={folder}/step8/compare/toy-bert.step0.parquet",
    ]
