"""A local corpus the corpus job could not read stops the run when the config is read, before any job: the weight
measures of a local run need no corpus and would otherwise run (minutes, on a real model) before the corpus job
failed. Checked in the main Snakemake process (anisweep.corpus_files)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from anisweep.corpus_files import CorpusError, check_local_corpus

from conftest import snakemake_command
from hubcache import save_tiny_pythia

# the tiny model has hidden size 32 and 64 positions (tests/hubcache.py)
EXTRACT = {"n_sequences": 4, "seq_len": 16, "batch_size": 2, "sample_tokens": 64, "device": "cpu"}


def binary_file(path: Path) -> Path:
    """A compiled object where the text should be: a NUL-padded header, then a byte no UTF-8 text holds."""
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\xc8\x00\x3e\x00")
    return path


def text(source: list[str], **keys) -> dict:
    return {"source": "text", "paths": [str(p) for p in source], **keys}


def test_a_binary_text_file_is_named_with_its_first_byte_that_is_not_utf8(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("First paragraph.\n\nSecond one.\n", encoding="utf-8")
    bad = binary_file(tmp_path / "eval.txt")
    with pytest.raises(CorpusError) as raised:
        check_local_corpus(text([good, bad]))
    message = str(raised.value)
    assert f"corpus text file {str(bad)!r} is not UTF-8: byte 0xc8 at byte offset 16" in message
    assert "good.txt" not in message and "re-encode it to UTF-8" in message


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: d / "absent.txt", "corpus text file not found: '{path}'"),
        (lambda d: (d / "texts").mkdir() or d / "texts", "corpus text file '{path}' is a folder"),
        (lambda d: (d / "blank.txt").write_text(" \n\n\t\n") and d / "blank.txt", "corpus.paths {path}: no text"),
    ],
    ids=["missing", "folder", "whitespace-alone"],
)
def test_a_text_file_that_is_missing_a_folder_or_blank_is_named(tmp_path, make, named):
    path = make(tmp_path)
    with pytest.raises(CorpusError, match="^" + re.escape(named.format(path=path))):
        check_local_corpus(text([path]))


def test_a_split_that_is_not_one_of_the_three_is_named(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("Some text.\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="corpus.split of a 'text' source must be one of paragraph, line, file"):
        check_local_corpus(text([good], split="sentence"))


def test_readable_text_and_the_other_sources_pass(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("Caf\u00e9 au lait.\n", encoding="utf-8")
    check_local_corpus(text([good], split="line"))
    check_local_corpus({"source": "builtin"})
    check_local_corpus({"source": "hf_dataset", "name": "Salesforce/wikitext"})  # read where the network is


def test_an_image_folder_that_is_missing_or_holds_no_images_is_named(tmp_path):
    with pytest.raises(CorpusError, match=f"corpus path '{tmp_path / 'photos'}' does not exist"):
        check_local_corpus({"source": "images", "paths": [str(tmp_path / "photos")]})
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "notes.txt").write_text("no image here")
    with pytest.raises(CorpusError, match="no image files under"):
        check_local_corpus({"source": "images", "paths": [str(tmp_path / "photos")]})


@pytest.mark.slow  # snakemake in a subprocess
def test_a_binary_corpus_stops_snakemake_before_the_weights_job_of_a_local_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(save_tiny_pythia(tmp_path / "pythia"), run / "step1")
    bad = binary_file(tmp_path / "eval.txt")
    config = {
        "models": [{"family": "local", "name": "run", "path": str(run), "steps": "all"}],
        "extract": EXTRACT,
        "corpus": text([bad]),
    }
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    command = snakemake_command(work, "--configfile", str(work / "config.yaml"), "--cores", "1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stderr[-2000:]
    assert f"config: corpus text file {str(bad)!r} is not UTF-8: byte 0xc8" in done.stderr, done.stderr[-2000:]
    assert not any((work / name).exists() for name in ("logs", "results", "resources", "weights"))
