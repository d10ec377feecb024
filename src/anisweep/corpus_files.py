"""A `text` corpus's files as the corpus step reads them, and a local corpus checked when the config is read, before
any job: the jobs of a checkpoint that never read the corpus (the weight measures of a local run) would otherwise
run, for minutes, before the corpus job stops the run. This module imports neither torch nor the model code (the
Snakefile reads it at every start).

A `text` source's files are each read and decoded as the corpus step reads them: each is a readable UTF-8 file, and
together they hold some text (a file the size of the builtin corpus, 0.46 MB, in about 1 ms; text that is not all
ASCII decodes at about 110 MB/s). An `images` or `audio` source's paths are each there and hold files of its kind;
that each file decodes is the corpus step's check, as is everything about an `hf_dataset` (read where the network
is).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anisweep.media import SOURCE_MODALITY, media_files

TEXT_SPLITS = ("paragraph", "line", "file")  # how a `text` source's files are cut into documents


class CorpusError(ValueError):
    """A local corpus the corpus step could not read: the message names the file and what to do."""


def read_text_file(path: str | Path) -> str:
    """A corpus text file's text, with universal newlines (as a file read in text mode: \\r\\n and \\r become \\n)."""
    return utf8_text(path).replace("\r\n", "\n").replace("\r", "\n")


def utf8_text(path: str | Path) -> str:
    """A corpus text file decoded as UTF-8; a file that is missing (FileNotFoundError), a folder, unreadable or not
    UTF-8 is a ValueError naming it and what to do."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"corpus text file {str(path)!r} is a folder: list the text files in it under corpus.paths")
    if not p.is_file():
        raise FileNotFoundError(f"corpus text file not found: {str(path)!r} (resolved to {p.resolve()})")
    try:
        data = p.read_bytes()
    except OSError as error:
        raise ValueError(
            f"corpus text file {str(path)!r} cannot be read ({error.strerror}); make it readable to this user, or "
            "list another file under corpus.paths"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"corpus text file {str(path)!r} is not UTF-8: byte 0x{data[error.start]:02x} at byte offset "
            f"{error.start} (line {line}: {error.reason}); re-encode it to UTF-8 (e.g. `iconv -f latin1 -t utf-8 "
            f"{p.name} > {p.stem}.utf8{p.suffix}`, naming its real encoding) and list the new file under corpus.paths"
        ) from error


def check_local_corpus(source: Mapping[str, Any]) -> None:
    """A CorpusError where the corpus section's local files cannot be read as its source says."""
    kind = source.get("source", "builtin")
    try:
        if kind == "text":
            _check_text(source)
        elif kind in SOURCE_MODALITY:
            media_files(source.get("paths") or [], SOURCE_MODALITY[kind])
    except CorpusError:
        raise
    except (OSError, ValueError) as error:  # a missing file is a FileNotFoundError, as the corpus job says it
        raise CorpusError(str(error)) from None


def _check_text(source: Mapping[str, Any]) -> None:
    paths = source.get("paths")
    paths = [paths] if isinstance(paths, (str, Path)) else paths
    if not paths:
        raise CorpusError("corpus.source is 'text' but corpus.paths lists no file: name your UTF-8 text files")
    split = source.get("split", "paragraph")
    if split not in TEXT_SPLITS:
        raise CorpusError(f"corpus.split of a 'text' source must be one of {', '.join(TEXT_SPLITS)}, got {split!r}")
    if not any([utf8_text(path).strip() for path in paths]):  # a list: every file is read, so each is checked
        raise CorpusError(
            f"corpus.paths {', '.join(map(str, paths))}: no text in them (empty, or whitespace alone); name files "
            "that hold the evaluation text"
        )
