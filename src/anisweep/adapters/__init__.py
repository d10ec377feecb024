"""One adapter per architecture; `adapter_for(config)` picks it or names the supported ones."""

from __future__ import annotations

from anisweep.adapters.albert import AlbertAdapter
from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, PreRotaryQK, ResidSite
from anisweep.adapters.bert import BertAdapter
from anisweep.adapters.canine import CanineAdapter
from anisweep.adapters.cnn import ConvNetAdapter
from anisweep.adapters.cvt import CvtAdapter
from anisweep.adapters.gpt2 import GPT2Adapter
from anisweep.adapters.gpt_neox import GPTNeoXAdapter
from anisweep.adapters.llama import LlamaAdapter
from anisweep.adapters.olmo import OlmoAdapter
from anisweep.adapters.olmo2 import Olmo2Adapter
from anisweep.adapters.roberta import RobertaAdapter
from anisweep.adapters.segformer import SegformerAdapter
from anisweep.adapters.t5 import T5Adapter
from anisweep.adapters.vit import ViTAdapter
from anisweep.adapters.wav2vec2 import Wav2Vec2Adapter
from anisweep.adapters.whisper import WhisperAdapter

ADAPTERS: tuple[Adapter, ...] = (
    BertAdapter(),
    GPTNeoXAdapter(),
    GPT2Adapter(),
    LlamaAdapter(),
    OlmoAdapter(),
    Olmo2Adapter(),
    RobertaAdapter(),
    AlbertAdapter(),
    T5Adapter(),
    CanineAdapter(),
    ViTAdapter(),
    ConvNetAdapter(),
    SegformerAdapter(),
    CvtAdapter(),
    Wav2Vec2Adapter(),
    WhisperAdapter(),
)


class UnsupportedArchitecture(ValueError):
    pass


def supported() -> list[str]:
    return sorted(arch for adapter in ADAPTERS for arch in adapter.architectures)


def adapter_for(config) -> Adapter:
    for adapter in ADAPTERS:
        if config.model_type in adapter.model_types:
            return adapter
    archs = ", ".join(getattr(config, "architectures", None) or [config.model_type])
    raise UnsupportedArchitecture(
        f"no adapter knows the architecture {archs!r} (model_type {config.model_type!r}); "
        f"supported: {', '.join(supported())}. Add one under src/anisweep/adapters/."
    )


__all__ = [
    "ADAPTERS",
    "Adapter",
    "AttentionSite",
    "Geometry",
    "LayerNormSite",
    "PreRotaryQK",
    "ResidSite",
    "UnsupportedArchitecture",
    "adapter_for",
    "supported",
]
