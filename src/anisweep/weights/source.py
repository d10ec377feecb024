"""Where a checkpoint's tensors come from, one tensor at a time.

A source knows the tensors' names and reads only those asked for: a local folder's safetensors through
`safe_open` (the file is memory-mapped, only the tensor's bytes are touched), a Hub repository's safetensors
through HTTP range reads (anisweep.weights.remote). Pickled ``pytorch_model*.bin`` files cannot be read in part:
the whole file is loaded, and that is said once per source on stderr.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

SAFETENSORS = re.compile(r"[^/]+\.safetensors")
BIN = re.compile(r"pytorch_model(?:-\d+-of-\d+)?\.bin")


def weight_files(names) -> list[str]:
    """The weight files among `names` that from_pretrained loads: the safetensors, else the pickled .bin shards
    (anisweep.checkpoints.fetch prefers them alike)."""
    names = sorted(n for n in names if "/" not in n)
    return [n for n in names if SAFETENSORS.fullmatch(n)] or [n for n in names if BIN.fullmatch(n)]


class WeightsError(ValueError):
    """A tensor a measure needs that the checkpoint lacks, or a folder with no weights."""


class Unmeasurable(WeightsError):
    """What an analysis of the weights reads is not in this checkpoint (an architecture no layout names, a model
    saved without its head), or not in what extract kept of it: the analysis records why, as its one row with a
    `reason` (anisweep.tables.unmeasured_row), and the checkpoint's other tables stand."""


class LocalSource:
    """The tensors of a saved model folder (config.json and safetensors or .bin files)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)  # holds config.json (and the tokenizer, for most)
        if not self.folder.is_dir():
            raise WeightsError(f"checkpoint folder {self.folder} does not exist")
        self.files = weight_files(p.name for p in self.folder.iterdir() if p.is_file())
        if not self.files or not (self.folder / "config.json").is_file():
            raise WeightsError(f"{self.folder}: no config.json, or no *.safetensors or pytorch_model*.bin weights")
        self.config = json.loads((self.folder / "config.json").read_text())
        self.bytes_read = 0
        self._where: dict[str, str] | None = None
        self._whole: dict[str, dict[str, torch.Tensor]] = {}
        self._said = False

    @property
    def pickled(self) -> bool:
        return not self.files[0].endswith(".safetensors")

    def names(self) -> list[str]:
        return sorted(self._index())

    def _index(self) -> dict[str, str]:
        if self._where is None:
            where = {}
            for name in self.files:
                if self.pickled:
                    where |= dict.fromkeys(self._load_whole(name), name)
                else:
                    from safetensors import safe_open

                    with safe_open(self.folder / name, "pt") as f:
                        where |= dict.fromkeys(f.keys(), name)
            self._where = where
        return self._where

    def _load_whole(self, name: str) -> dict[str, torch.Tensor]:
        if name not in self._whole:
            if not self._said:
                print(
                    f"weights: {self.folder} holds pickled .bin files, which cannot be read in part: each is read "
                    "whole",
                    file=sys.stderr,
                )
                self._said = True
            self._whole[name] = torch.load(self.folder / name, map_location="cpu", weights_only=True, mmap=True)
            self.bytes_read += (self.folder / name).stat().st_size
        return self._whole[name]

    def get(self, name: str) -> torch.Tensor:
        index = self._index()
        if name not in index:
            raise WeightsError(f"{self.folder}: no tensor {name!r} in {', '.join(self.files)}")
        if self.pickled:
            return self._load_whole(index[name])[name]
        from safetensors import safe_open

        with safe_open(self.folder / index[name], "pt") as f:
            tensor = f.get_tensor(name)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def get_rows(self, name: str, spans) -> torch.Tensor:
        """Rows [a, b) of each span of a matrix, stacked: only those rows are read from a safetensors file."""
        index = self._index()
        if name not in index or self.pickled:
            tensor = self.get(name)
            return torch.cat([tensor[a:b] for a, b in spans])
        from safetensors import safe_open

        with safe_open(self.folder / index[name], "pt") as f:
            matrix = f.get_slice(name)
            tensor = torch.cat([matrix[a:b] for a, b in spans])
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor
