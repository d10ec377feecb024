"""The one console line a failing job leaves: its cause, where the cause is known before any checkpoint (an empty
corpus), and where the job could not write its own log (a full disk)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

from test_bad_input import run_cli

from anisweep.job_failure import failure_suffix


def test_an_empty_corpus_fails_at_the_corpus_step_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    corpus = {"source": "text", "paths": [str(empty)]}
    out = tmp_path / "resources" / "corpus.parquet"
    code, line = run_cli(capsys, "corpus", "--corpus", json.dumps(corpus), "--out", out)
    assert code == 1 and line.startswith("ValueError: the corpus ") and str(empty) in line, line
    assert "holds no text (every document is empty or blank)" in line and "`corpus:`" in line
    assert not out.exists()


def run_failing(tmp_path, command: str, log) -> subprocess.CompletedProcess:
    """`command 2> log` and the suffix of a job named toy/toy-neox/step4, in bash as Snakemake runs it."""
    suffix = failure_suffix(shlex.quote(str(log)), "toy/toy-neox/step4", name_in_line=False)
    line = f"{command} 2> {shlex.quote(str(log))} {suffix}"
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=tmp_path, timeout=60)


def test_a_failing_job_repeats_its_logs_last_line(tmp_path):
    done = run_failing(tmp_path, "python3 -c 'import sys; sys.exit(\"toy/toy-neox/step4: ValueError: why\")'", "a.log")
    assert done.returncode == 1 and done.stderr == "toy/toy-neox/step4: ValueError: why\n"


def test_a_job_that_could_not_write_its_log_says_so_with_the_free_space(tmp_path):
    """A log on a full disk: /dev/full takes the redirection and fails every write with ENOSPC."""
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "step4.log"
    log.symlink_to("/dev/full")
    done = run_failing(tmp_path, "python3 -c 'import sys; sys.exit(\"the cause\")'", log)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"toy/toy-neox/step4: exit status 1 and nothing in its log {log}: is the disk holding it full?"
    )
    assert re.search(r"\(\S+ free on /\S*\)$", line), line


def test_a_kill_is_named_as_such(tmp_path):
    done = run_failing(tmp_path, "bash -c 'kill -9 $$'", "k.log")
    assert done.returncode == 137
    assert "toy/toy-neox/step4: killed by signal 9 (9: out of memory, or a scheduler's limit)" in done.stderr
