"""Extract's settings and the model it loads (one load per checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from anisweep import schema
from anisweep.adapters import Adapter, Geometry, adapter_for
from anisweep.extract.device import torch_device as resolve_device
from anisweep.extract.recorder import (
    ATTENTION_NAME,
    register_attention,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


_DEFAULTS = schema.defaults("extract")


@dataclass
class ExtractSettings:
    """The config's `extract` section; the defaults are the schema's (anisweep/config.schema.yaml)."""

    n_sequences: int = _DEFAULTS["n_sequences"]
    seq_len: int = _DEFAULTS["seq_len"]
    batch_size: int = _DEFAULTS["batch_size"]
    sample_tokens: int = _DEFAULTS["sample_tokens"]
    device: str = _DEFAULTS["device"]
    dtype: str = _DEFAULTS["dtype"]
    seed: int = _DEFAULTS["seed"]
    attention: str = _DEFAULTS["attention"]  # auto: the Triton kernel on CUDA, torch ops elsewhere
    qk_sample_tokens: int = _DEFAULTS["qk_sample_tokens"]
    score_bins: dict | None = _DEFAULTS["score_bins"]  # None: no score histogram (it costs a second QK^T)
    threads: int | None = None  # resources.extract_threads

    def torch_device(self) -> torch.device:
        return resolve_device(self.device)


@dataclass
class LoadedModel:
    """A checkpoint ready to run: the LM (for its output embedding), the base model that runs, its adapter
    and its geometry."""

    model: nn.Module
    base: nn.Module
    adapter: Adapter
    geometry: Geometry


def load_model(path: str | Path, dtype: str = "float32", device: torch.device | str = "cpu") -> LoadedModel:
    """Load a checkpoint with the recording attention.

    The LM class is loaded when the checkpoint has one, so that the output embedding is available for
    I(W); only the base model ever runs.
    """
    import transformers

    register_attention()
    config = transformers.AutoConfig.from_pretrained(path)
    adapter = adapter_for(config)
    arch = (config.architectures or [None])[0]
    cls = getattr(transformers, arch) if arch in adapter.architectures else transformers.AutoModel
    model = cls.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=ATTENTION_NAME)
    model.to(device).eval()
    return LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))
