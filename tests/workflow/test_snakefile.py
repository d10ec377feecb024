"""The Snakefile itself: which config a run uses, what a failing rule says on the console, lint and format.

Dry runs (`-n --printshellcmds`) show each job's command as Snakemake would run it, so the effective config
is read off the commands; only the failure test runs a job (the corpus rule, seconds).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import job_stats, snakemake_command
from warm_snakemake import dry_run

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())


def snakemake(workdir: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "--cores", "2", *args)
    if "-n" in args:
        return dry_run(command, timeout=timeout)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def shell_commands(done: subprocess.CompletedProcess, command: str) -> list[list[str]]:
    """The argument lists of the printed shell commands of one CLI command (`anisweep extract ...`)."""
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if f" -m anisweep {command} " in line]
    assert lines, (done.stdout + done.stderr)[-3000:]
    return [shlex.split(line.split("Shell command:", 1)[-1].split(" 2> ")[0]) for line in lines]


def extract_settings(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(args[args.index("--settings") + 1]) for args in shell_commands(done, "extract")]


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_user_config_is_not_merged_into_the_default(tmp_path):
    """config/config.yaml sets extract.device: cpu and sample_tokens: 1024; a user's config that leaves them out
    gets the schema's defaults, never the embedded default config's values."""
    user = {**TINY, "extract": {k: v for k, v in TINY["extract"].items() if k not in ("device", "sample_tokens")}}
    configfile = tmp_path / "my.yaml"
    configfile.write_text(yaml.safe_dump(user))
    done = snakemake(tmp_path, "--configfile", str(configfile), "-n", "--printshellcmds")
    settings = extract_settings(done)
    assert len(settings) == 6  # two toys, three steps each
    for s in settings:
        assert s.get("device", "auto") == "auto" and s.get("sample_tokens", 4096) == 4096, s
        assert s["n_sequences"] == TINY["extract"]["n_sequences"]
    assert "is extended by additional config" not in done.stdout + done.stderr


@pytest.mark.slow  # snakemake parses the whole workflow
def test_without_a_configfile_the_embedded_default_runs(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    done = snakemake(tmp_path, "-n", "--printshellcmds")
    settings = extract_settings(done)
    assert len(settings) == sum(len(spec["steps"]) for spec in default["toy"].values())
    for s in settings:
        assert s["device"] == default["extract"]["device"] and s["sample_tokens"] == default["extract"]["sample_tokens"]
    # --config still overrides the embedded default
    done = snakemake(tmp_path, "-n", "--printshellcmds", "--config", "extract={'device': 'auto'}")
    assert {(s["device"], s["sample_tokens"]) for s in extract_settings(done)} == {
        ("auto", default["extract"]["sample_tokens"])
    }


@pytest.mark.slow  # snakemake parses the whole workflow
def test_every_rule_logs_the_same_way_and_repeats_its_cause(tmp_path):
    """Every command writes its stderr to its log (`2> {log}`) and, when it fails, repeats the log's last line on
    the console, prefixed with the job's name where the command does not name a checkpoint itself."""
    configfile = tmp_path / "tiny.yaml"
    configfile.write_text(yaml.safe_dump(TINY))
    done = snakemake(tmp_path, "--configfile", str(configfile), "-n", "--printshellcmds")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if " -m anisweep " in line]
    assert len(lines) > 20
    for line in lines:
        command = re.search(r" -m anisweep ([a-z-]+) ", line)[1]
        log = re.search(r" 2> (\S+) \|\| \{ rc=\$\?; ", line)
        assert log, line
        assert f"tail -n 1 {log[1]}" in line and "exit $rc; }" in line, line
        assert log[1].startswith("logs/"), line
        # the per-checkpoint commands name the checkpoint in the line themselves (cli._checkpoint_key)
        if command not in ("fetch", "extract", "metrics", "measure", "compare", "gradients", "weights", "logit-lens"):
            assert re.search(r"echo '?[a-z_]+[^\"]*'?\": \$\(tail -n 1 ", line), line
    assert any("echo 'sweep toy/toy-bert'\": $(tail -n 1 logs/sweep/toy/toy-bert.log)\"" in line for line in lines)


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_failing_rule_without_a_checkpoint_names_its_cause_on_the_console(tmp_path):
    """The corpus rule fails on a dataset it cannot load (a local text corpus is checked when the config is read, so
    a job can fail only on what cannot be checked then): the console names the rule and the cause."""
    missing = tmp_path / "no-such-dataset"
    configfile = tmp_path / "bad.yaml"
    configfile.write_text(
        yaml.safe_dump({**TINY, "corpus": {"source": "hf_dataset", "name": str(missing), "split": "validation"}})
    )
    done = snakemake(tmp_path, "resources/corpus.parquet", "--configfile", str(configfile))
    assert done.returncode != 0
    line = next((line for line in done.stderr.splitlines() if line.startswith("corpus: ")), None)
    assert line, done.stderr[-3000:]
    assert str(missing) in line


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_dry_run_imports_no_torch(tmp_path):
    """Parsing the Snakefile (every `snakemake -n`) needs neither torch nor scipy: the rules import them in their
    own processes."""
    configfile = tmp_path / "tiny.yaml"
    configfile.write_text(yaml.safe_dump(TINY))
    command = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(configfile),
        "--cores",
        "2",
        "-n",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not {"torch", "scipy", "transformers"} & imported


def test_the_rules_conda_env_has_the_packages_dependencies():
    """workflow/envs/anisweep.yaml (every rule's `conda:`, used with --sdm conda) lists pyproject's dependencies:
    PyTorch from conda-forge as in environment.yml, the rest from pip; Snakemake is not needed inside a job."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        Requirement(r).name.replace("_", "-").lower(): str(Requirement(r).specifier) for r in project["dependencies"]
    }
    env = yaml.safe_load((ROOT / "workflow" / "envs" / "anisweep.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {Requirement(r).name.replace("_", "-").lower(): str(Requirement(r).specifier) for r in pip}
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert f"pytorch{wanted.pop('torch')}" in conda and "python=3.11" in conda
    wanted.pop("snakemake")
    assert listed == wanted


@pytest.mark.slow  # snakemake parses the whole workflow
def test_several_families_get_the_cross_family_figure(tmp_path):
    """With models of two families, rule all asks for results/figures/compare_families.png, drawn by
    plot-families from every model's sweep; with one family (the toys) it does not."""
    config = {
        **TINY,
        "models": [
            {"family": "olmo", "name": "OLMo-1B-hf", "steps": [1000]},
            {"family": "gpt2", "name": "alias-gpt2-small-x21", "steps": [0]},
        ],
        "gradients": {"enabled": False},  # the tiny config's gradient steps are the toys'
        "audit": {"enabled": False},  # offline, with nothing cached: no grid to audit (tests/checkpoints/test_audit.py)
    }
    configfile = tmp_path / "families.yaml"
    configfile.write_text(yaml.safe_dump(config))
    done = snakemake(tmp_path, "--configfile", str(configfile), "-n", "--printshellcmds")
    (args,) = shell_commands(done, "plot-families")
    assert args[args.index("--out") + 1] == "results/figures/compare_families.png"
    assert sorted(args[args.index("--out") + 2 :]) == [
        "results/gpt2/alias-gpt2-small-x21/sweep.parquet",
        "results/olmo/OLMo-1B-hf/sweep.parquet",
    ]
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))  # two toys: one family
    single = snakemake(tmp_path, "--configfile", str(tmp_path / "tiny.yaml"), "-n", "--printshellcmds")
    assert single.returncode == 0, single.stderr[-3000:]
    assert " plot-families " not in single.stdout + single.stderr


@pytest.mark.slow  # snakemake parses the whole workflow
def test_a_weights_only_sweep_runs_no_model(tmp_path):
    """`snakemake weights_only`: every checkpoint's weight measure and the circuit figures, and nothing that runs a
    model (no fetch, no extract, no logit lens, no metrics)."""
    configfile = tmp_path / "tiny.yaml"
    configfile.write_text(yaml.safe_dump(TINY))
    done = snakemake(tmp_path, "--configfile", str(configfile), "-n", "weights_only")
    assert done.returncode == 0, done.stderr[-3000:]
    assert job_stats(done) == {"plot_circuits": 2, "train_toy": 2, "weights": 6, "weights_only": 1}
