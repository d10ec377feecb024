"""Hierarchical vision transformers against Hugging Face's eager forward on the same pixel values: MiT (SegFormer's
encoder), whose stages widen, add heads and shrink their patch grid, and whose attention reads spatially reduced
keys (fewer keys than queries). Each layer's q and k means, attention statistics and residual stream are compared
with what eager attention and the model's own modules give."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers

from conftest import run_extract, saved

TOL = 1e-4


def mit_config():
    return transformers.SegformerConfig(
        num_channels=3,
        num_encoder_blocks=4,
        depths=[1, 1, 2, 1],
        sr_ratios=[4, 2, 1, 1],
        hidden_sizes=[8, 16, 24, 32],
        patch_sizes=[7, 3, 3, 3],
        strides=[4, 2, 2, 2],
        num_attention_heads=[1, 2, 3, 4],
        mlp_ratios=[2, 2, 2, 2],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )


@torch.no_grad()
def mit_reference(path, pixel_values):
    """Per layer (blocks numbered through the stages): q and k as the block's own projections give them (k of the
    reduced keys), eager attention probabilities, and each block's output."""
    model = transformers.SegformerModel.from_pretrained(path, attn_implementation="eager").eval()
    blocks = [block for stage in model.stages for block in stage.blocks]
    b, got, handles = pixel_values.shape[0], {}, []

    def heads(n):
        return lambda m, a, o, n=n: got.__setitem__(n, o.view(b, o.shape[1], m.out_features // d_of[n[1]], -1))

    d_of = {}
    for i, block in enumerate(blocks):
        d_of[i] = block.attention.head_dim
        handles.append(block.attention.q_proj.register_forward_hook(heads(("q", i))))
        handles.append(block.attention.k_proj.register_forward_hook(heads(("k", i))))
        handles.append(block.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(("resid", i + 1), o)))
    embed = model.stages[0].patch_embeddings
    handles.append(embed.register_forward_hook(lambda m, a, o: got.__setitem__(("resid", 0), o[0])))
    out = model(pixel_values=pixel_values, output_attentions=True)
    for handle in handles:
        handle.remove()
    return blocks, got, out.attentions


def test_mit_matches_eager_reference(tmp_path):
    path = saved(tmp_path, transformers.SegformerForImageClassification, mit_config(), "mit")
    pixel_values = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tables, loaded = run_extract(path, {"pixel_values": pixel_values}, batch_size=2)
    blocks, got, attentions = mit_reference(path, pixel_values)
    assert [a.shape[-1] < a.shape[-2] for a in attentions[:2]] == [True, True]  # reduced keys in stages 0 and 1
    qk, attention, stats = tables["qk"], tables["attention"], tables["hidden_stats"]
    assert qk.height == attention.height == sum(loaded.geometry.layer_heads) == 1 + 2 + 3 + 3 + 4
    for layer, probs in enumerate(attentions):
        q, k = got[("q", layer)].double(), got[("k", layer)].double()  # (B, T, H, d)
        for head in range(probs.shape[1]):
            row = qk.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            np.testing.assert_allclose(row["q_mean"], q[:, :, head].reshape(-1, q.shape[-1]).mean(0), atol=TOL)
            np.testing.assert_allclose(row["k_mean"], k[:, :, head].reshape(-1, k.shape[-1]).mean(0), atol=TOL)
            p = probs[:, head].double()  # (B, Tq, Tk)
            entropy = -(p * p.log()).sum(-1)
            row = attention.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            assert row["entropy_mean"] == pytest.approx(entropy.mean().item(), abs=TOL)
            assert row["p_max_mean"] == pytest.approx(p.max(-1).values.mean().item(), abs=TOL)
            assert row["n_rows"] == p.shape[0] * p.shape[1]
    for layer in range(len(blocks) + 1):
        x = got[("resid", layer)].double().reshape(-1, got[("resid", layer)].shape[-1])
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == "resid")).row(0, named=True)
        assert row["n"] == x.shape[0] and row["d"] == x.shape[1]
        np.testing.assert_allclose(row["sum_x"], x.sum(0).numpy(), rtol=TOL, atol=TOL * x.shape[0])
        unit = x / x.norm(dim=-1, keepdim=True)
        np.testing.assert_allclose(row["sum_unit"], unit.sum(0).numpy(), atol=TOL * x.shape[0])
    sites = set(stats["site"])
    assert {"stage_embed", "stage_ln_in", "final_ln_out"} <= sites
