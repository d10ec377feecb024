"""The comparison commands as a dry run prints them: compare_sweep's names every role of every pair (a pair table in
two roles gives compare.parquet its rows in each), and a pair's settings carry compare.cca_max_width, the width above
which its layers get CKA alone."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from anisweep.measures.compare import Settings

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


def pair_settings(tmp_path, compare_section):
    """The --settings of every compare_pair command a dry run of toy-bert's comparisons prints, parsed."""
    config = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    config["compare"] = {"against": ["final"], "layer_steps": [], **compare_section}
    configfile = tmp_path / "widths.yaml"
    configfile.write_text(yaml.safe_dump(config))
    target = "results/toy/toy-bert/compare.parquet"
    done = dry_run(snakemake_command(tmp_path, "--configfile", str(configfile), "-n", "--printshellcmds", target))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if " -m anisweep compare --extract-dir" in line]
    assert len(lines) == 2, (done.stdout + done.stderr)[-3000:]  # steps 0 and 8 against 32
    words = [shlex.split(line.split(" 2> ")[0]) for line in lines]
    return [json.loads(w[w.index("--settings") + 1]) for w in words]


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_pair_job_runs_svcca_and_pwcca_up_to_cca_max_width_and_cka_beyond(tmp_path):
    for section, limit in (({}, 1024), ({"cca_max_width": None}, None)):
        for recorded in pair_settings(tmp_path, section):
            assert recorded["cca_max_width"] == limit
            settings = Settings.of(recorded)
            assert settings.cca_measures(32) == ("svcca", "pwcca")  # the toys: every measure
            assert settings.cca_measures(2048) == (("svcca", "pwcca") if limit is None else ())  # pythia-1b's width
