"""Vision transformers (ViT, DeiT, BEiT) against Hugging Face's eager forward on the same pixel values: q and k as
each layer's own projections give them, the attention probabilities eager attention returns (BEiT's with its
relative position bias), the residual stream after the embedding and each block, and the final LayerNorm."""

from __future__ import annotations

import pytest
import torch
import transformers
from test_extract import check_all

from conftest import run_extract, saved

TINY = dict(
    image_size=16,
    patch_size=4,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def vit_config(**extra):
    return transformers.ViTConfig(**TINY, **extra)


def deit_config(**extra):
    return transformers.DeiTConfig(**TINY, **extra)


def beit_config(**extra):
    beit = dict(use_relative_position_bias=True, layer_scale_init_value=0.5, use_mean_pooling=False, vocab_size=32)
    return transformers.BeitConfig(**TINY, **(beit | extra))


VISION = {  # name: (model class, config, special tokens before the patches)
    "vit": (transformers.ViTForImageClassification, vit_config, 1),
    "deit": (transformers.DeiTForImageClassificationWithTeacher, deit_config, 2),
    "beit": (transformers.BeitForImageClassification, beit_config, 1),
    "beit_base": (transformers.BeitModel, lambda: beit_config(use_mean_pooling=True), 1),
}


def saved_model(tmp_path, cls, config, name):
    """A tiny random model with no all-zero parameter (BEiT's [CLS] starts at zero: a zero vector has no direction)."""
    path = saved(tmp_path, cls, config, name)
    model = cls.from_pretrained(path)
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.any():
                parameter.normal_(0, 0.5)
    model.save_pretrained(path)
    return path


def pixels(n=5, size=16, seed=0):
    return {"pixel_values": torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))}


@torch.no_grad()
def vision_reference(path, batch):
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    config, layers = model.config, model.layers
    b, n_heads = batch["pixel_values"].shape[0], config.num_attention_heads
    grabbed, handles = {}, []

    def keep(name, split=False):
        def hook(module, args, output):
            grabbed[name] = output.view(b, output.shape[1], n_heads, -1).transpose(1, 2) if split else output
            if not split:
                grabbed[f"{name}_in"] = args[0]

        return hook

    handles.append(model.embeddings.register_forward_hook(keep("resid0")))
    for i, block in enumerate(layers):
        handles.append(block.register_forward_hook(keep(f"resid{i + 1}")))
        handles.append(block.attention.q_proj.register_forward_hook(keep(("q", i), split=True)))
        handles.append(block.attention.k_proj.register_forward_hook(keep(("k", i), split=True)))
    final = model.layernorm if isinstance(model.layernorm, torch.nn.LayerNorm) else None
    if final is not None:
        handles.append(final.register_forward_hook(keep("final")))
    out = model(**batch, output_attentions=True)
    for handle in handles:
        handle.remove()
    t = grabbed["resid0"].shape[1]
    bias = {}
    for i, block in enumerate(layers):
        if getattr(block, "relative_position_bias", None) is not None:
            side = config.image_size // config.patch_size
            bias[i] = block.relative_position_bias((side, side), dim_size=t)
    ref = dict(
        attentions=list(out.attentions),
        q={(i, "pre"): grabbed[("q", i)] for i in range(len(layers))},
        k={(i, "pre"): grabbed[("k", i)] for i in range(len(layers))},
        bias=bias,
        resid=[grabbed[f"resid{i}"] for i in range(len(layers) + 1)],
        d=config.hidden_size // n_heads,
        scaling=[(config.hidden_size // n_heads) ** -0.5] * len(layers),
    )
    if final is not None:
        ref |= dict(ln_in=grabbed["final_in"], ln_out=grabbed["final"])
    return ref, t


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", sorted(VISION))
def test_vision_transformers_match_eager_reference(tmp_path, kind):
    cls, config, n_special = VISION[kind]
    path = saved_model(tmp_path, cls, config(), kind)
    batch = pixels()
    tables, loaded = run_extract(path, batch, batch_size=2)
    ref, t = vision_reference(path, batch)
    assert t == n_special + (16 // 4) ** 2
    valid = {"attention_mask": torch.ones(5, t, dtype=torch.bool)}
    check_all(tables, ref, valid, causal=False)
    assert tables["embeddings"].is_empty()
    assert set(tables["hidden"]["token_id"].unique()) == {-1}
    if kind == "beit_base":  # mean pooling: no LayerNorm on the tokens at the end
        assert "final_ln_out" not in set(tables["hidden_stats"]["site"])


def test_beit_relative_bias_is_part_of_the_scores(tmp_path):
    """Without the bias the probabilities differ: the comparison above can fail."""
    cls, config, _ = VISION["beit"]
    path = saved_model(tmp_path, cls, config(), "beit")
    batch = pixels()
    tables, _ = run_extract(path, batch, batch_size=5)
    ref, t = vision_reference(path, batch)
    ref["bias"] = {}
    with pytest.raises(AssertionError):
        check_all(tables, ref, {"attention_mask": torch.ones(5, t, dtype=torch.bool)}, causal=False)
