"""RoBERTa: BERT's encoder under other names (`roberta.encoder.layer.{i}.attention.self.{query,key,value}`,
post-LayerNorm blocks), with positions counted from `pad_token_id + 1` and computed from the input ids (padding
tokens get position `pad_token_id`): nothing the extractor reads depends on that, the embedding module's output
is the residual stream at layer 0 whatever positions it added."""

from __future__ import annotations

from anisweep.adapters.bert import BertAdapter


class RobertaAdapter(BertAdapter):
    model_types = ("roberta",)
    architectures = ("RobertaModel", "RobertaForMaskedLM", "RobertaForCausalLM")
