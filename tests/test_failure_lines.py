"""The one console line a failing job leaves: its cause, where the cause is known before any checkpoint (an empty
corpus), and where the job could not write its own log (a full disk)."""

from __future__ import annotations

import json

from test_bad_input import run_cli


def test_an_empty_corpus_fails_at_the_corpus_step_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    corpus = {"source": "text", "paths": [str(empty)]}
    out = tmp_path / "resources" / "corpus.parquet"
    code, line = run_cli(capsys, "corpus", "--corpus", json.dumps(corpus), "--out", out)
    assert code == 1 and line.startswith("ValueError: the corpus ") and str(empty) in line, line
    assert "holds no text (every document is empty or blank)" in line and "`corpus:`" in line
    assert not out.exists()
