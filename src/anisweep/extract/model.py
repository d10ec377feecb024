"""Extract's settings and the model it loads (one load per checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from anisweep import schema
from anisweep.adapters import Adapter, Geometry, adapter_for
from anisweep.extract.checked_load import load_checked
from anisweep.extract.device import torch_device as resolve_device
from anisweep.extract.recorder import (
    ATTENTION_NAME,
    register_attention,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


_DEFAULTS = schema.defaults("extract")

#: what needs a checkpoint's own LM head, and what to do without one
GRADIENT_HEAD = (
    "the gradient analysis's loss runs through: leave this step out of gradients.steps, or set gradients.enabled: false"
)


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
    sample_precision: str = _DEFAULTS["sample_precision"]  # the sampled vectors' storage (sample_storage)
    score_bins: dict | None = _DEFAULTS["score_bins"]  # None: no score histogram (it costs a second QK^T)
    max_unknown_token_share: float = _DEFAULTS["max_unknown_token_share"]  # above it: a PreflightError
    units: int = _DEFAULTS["units"]  # at most this many resampling units keep their sums (streaming.Units)
    threads: int | None = None  # resources.extract_threads

    def torch_device(self) -> torch.device:
        return resolve_device(self.device)


@dataclass
class LoadedModel:
    """A checkpoint ready to run: the LM (for its output embedding), the base model that runs, its adapter
    and its geometry; `initialised`, the head's tensors the checkpoint lacked (random: nothing read from them is
    reported), and `ignored`, the checkpoint's tensors of another architecture's head (anisweep.extract.checked_load).
    """

    model: nn.Module
    base: nn.Module
    adapter: Adapter
    geometry: Geometry
    initialised: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    trust_remote_code: bool = False  # the entry's: its repository's code may run (its tokenizer's too)


def load_model(
    path: str | Path,
    dtype: str = "float32",
    device: torch.device | str = "cpu",
    head_needed: bool = False,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a checkpoint with the recording attention.

    The LM class is loaded when the checkpoint has one, so that the output embedding is available for
    I(W); only the base model ever runs. A tensor the weight files lack, hold in another shape or hold beyond
    the model's is a WeightsError before anything runs; the LM head alone may be missing (initialised, named in
    `initialised`) unless `head_needed` (the gradient analysis's loss runs through it). `trust_remote_code`: the
    repository's own modelling code may run (a `hub` entry's `trust_remote_code: true`; never otherwise).
    """
    import transformers

    register_attention()
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    adapter = adapter_for(config)
    arch = (config.architectures or [None])[0]
    cls = getattr(transformers, arch) if arch in adapter.architectures else transformers.AutoModel
    loaded = load_checked(
        cls,
        path,
        head_may_be_initialised=not head_needed,
        head_needed_by=GRADIENT_HEAD,
        dtype=DTYPES[dtype],
        attn_implementation=adapter.attn_implementation or ATTENTION_NAME,
        **({"trust_remote_code": True} if trust_remote_code else {}),
    )
    model = loaded.model
    model.to(device).eval()
    return LoadedModel(
        model,
        adapter.base_model(model),
        adapter,
        adapter.geometry(model.config),
        loaded.initialised,
        loaded.ignored,
        trust_remote_code,
    )
