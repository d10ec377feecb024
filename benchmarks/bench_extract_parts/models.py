"""The models and the variants every part measures, all on the same batch.

Models are built from config with random weights (no download), bert-base shape (BertModel) and pythia-160m shape
(GPTNeoXModel: rotary 0.25, parallel residual), and the other SHAPES.

Variants: `plain` (a base-model forward, sdpa attention, no hooks: every ratio's reference); `extract`
(anisweep.extract.run.run with every statistic, the score histogram left out as both sweep configs leave it, and
the hidden-state sample drawn at the rate of the shape's real sweep config, 1 token in 8 for config/multiberts.yaml
and 3 in 16 for config/pythia.yaml, which is what one mini-batch of those sweeps contributes; memory over growing
n_sequences keeps the config's whole sample: the forward and its accumulators, not the writing of tables);
`extract_without_outliers` (extract without_outlier_statistics); `extract_without_units` (extract.units 0: no
resampling units' sums); `hf_keep_all` (eager attention, output_attentions
+ output_hidden_states, all outputs kept); `tl` (TransformerLens 3.9 `run_with_cache` on a HookedEncoder /
HookedTransformer of the same shape, base model only: the HookedTransformer runs with return_type=None, which stops
after ln_final; HookedEncoder.forward always applies its MLM head, so its cache is filled with the same caching
hooks that run_with_cache installs, around `encoder_output`). TransformerLens is an optional benchmark extra, never
a runtime dependency: its part runs in a separate venv (--tl-python) with its own plain baseline in the same
process.
"""

from __future__ import annotations

import contextlib

import torch

from .core import SHAPES, VOCAB, sample_size


def hf_model_config(shape: str):
    import transformers

    vocab, width, layers, heads = SHAPES[shape]
    if shape.startswith("bert"):
        return transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            max_position_embeddings=512,
        )
    return transformers.GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=2048,
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
    )


def hf_model(shape: str, device="cpu", dtype=torch.float32):
    import transformers

    torch.manual_seed(0)
    cls = transformers.BertModel if shape.startswith("bert") else transformers.GPTNeoXModel
    with torch.device(device):  # initialised where it runs: pythia-1.4b takes minutes on the CPU
        return cls(hf_model_config(shape)).to(dtype).eval()


def tl_model(shape: str):
    from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    common = dict(
        n_layers=12,
        d_model=768,
        n_heads=12,
        d_head=64,
        d_mlp=3072,
        act_fn="gelu",
        normalization_type="LN",
        device="cpu",
        dtype=torch.float32,
    )
    if shape == "bert":
        cfg = HookedTransformerConfig(
            **common, d_vocab=VOCAB["bert"], n_ctx=512, original_architecture="BertForMaskedLM"
        )
        model = HookedEncoder(cfg)
        with torch.no_grad():  # built from a config its weights are torch.empty: initialise them as BERT does
            for name, p in model.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf == "w":
                    p.fill_(1.0)
                elif leaf == "b" or leaf.startswith("b_"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
    else:
        cfg = HookedTransformerConfig(
            **common,
            d_vocab=VOCAB["pythia"],
            n_ctx=2048,
            positional_embedding_type="rotary",
            rotary_dim=16,
            parallel_attn_mlp=True,
            original_architecture="GPTNeoXForCausalLM",
        )
        model = HookedTransformer(cfg)
    return model.eval()


def make_batch(shape: str, n: int, seq_len: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, VOCAB[shape] - 1, (n, seq_len), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(n, seq_len, dtype=torch.long)}


@contextlib.contextmanager
def without_outlier_statistics():
    """extract without what it measures of the few directions and keys that carry the anisotropy: no per-dimension
    squares or top tokens at the sampled sites (rogue dimensions, massive activations), no column sums in the
    attention pass (attention sinks). The statistics' cost is extract's speed ratio with them against without."""
    from anisweep.extract import attention_torch, streaming

    attend, update, partial = attention_torch.attend, streaming.SinkStats.update, streaming.VectorStats.partial
    attention_torch.attend = lambda *args, **kw: attend(*args, **{**kw, "valid": None})
    streaming.SinkStats.update = lambda self, colsum, *args, **kw: None
    streaming.VectorStats.partial = staticmethod(
        lambda x, valid, wait_free=None, outliers=False, per_sequence=False: partial(
            x, valid, wait_free, per_sequence=per_sequence
        )
    )
    try:
        yield
    finally:
        attention_torch.attend, streaming.SinkStats.update = attend, update
        streaming.VectorStats.partial = staticmethod(partial)


def variants_for(shape: str, names: list[str], device="cpu", dtype=torch.float32) -> dict:
    """name -> (run(batch) -> kept outputs). HF variants share one model, switching its attention."""
    runs = {}
    if any(n in ("plain", "extract", "hf_keep_all") for n in names):
        model = hf_model(shape, device, dtype)

        def plain(batch):
            model.set_attn_implementation("sdpa")
            return model(**batch)

        def hf_keep_all(batch):
            model.set_attn_implementation("eager")
            return model(**batch, output_attentions=True, output_hidden_states=True)

        runs.update(plain=plain, hf_keep_all=hf_keep_all)
        if "extract" in names:
            from anisweep.adapters import adapter_for
            from anisweep.extract import recorder
            from anisweep.extract.model import ExtractSettings, LoadedModel
            from anisweep.extract.run import run

            recorder.register_attention()
            adapter = adapter_for(model.config)
            parts = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))

            def run_extract(batch, batch_size=None, sample_tokens=None, units=None):
                model.set_attn_implementation(recorder.ATTENTION_NAME)
                n, t = batch["input_ids"].shape
                settings = ExtractSettings(
                    n_sequences=n,
                    seq_len=t,
                    batch_size=batch_size or n,
                    sample_tokens=sample_tokens or sample_size(shape, n, t),
                    device=str(device),
                    **({} if units is None else {"units": units}),
                )
                return run(parts, batch, settings, progress=False)

            runs["extract"] = run_extract

            def run_extract_without_outliers(batch):
                with without_outlier_statistics():
                    return run_extract(batch)

            runs["extract_without_outliers"] = run_extract_without_outliers
            runs["extract_without_units"] = lambda batch: run_extract(batch, units=0)
    if "tl" in names:
        tl = tl_model(shape)

        def run_tl(batch):
            ids = batch["input_ids"]
            if shape == "pythia":
                return tl.run_with_cache(ids, return_type=None)
            cache, fwd, _ = tl.get_caching_hooks()  # what run_with_cache installs
            with tl.hooks(fwd_hooks=fwd):
                tl.encoder_output(ids)
            return cache

        runs["tl"] = run_tl
    return {name: runs[name] for name in names}
