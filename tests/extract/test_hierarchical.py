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


def cvt_config():
    return transformers.CvtConfig(
        embed_dim=[8, 12, 16],
        num_heads=[1, 2, 4],
        depth=[1, 2, 3],  # transformers indexes each stage's drop-path rates by its stage: depth[s] > s
        patch_sizes=[7, 3, 3],
        patch_stride=[4, 2, 2],
        patch_padding=[2, 1, 1],
        cls_token=[False, False, True],
        drop_path_rate=[0.0, 0.0, 0.0],
    )


@torch.no_grad()
def cvt_reference(path, pixel_values):
    """Per block (numbered through the stages): q and k as its own linear projections give them, split into heads,
    the attention probabilities from them with CvT's scale, and each block's output; each stage's map as
    transformers' `output_hidden_states` gives it."""
    model = transformers.CvtModel.from_pretrained(path).eval()
    blocks = [(s, block) for s, stage in enumerate(model.encoder.stages) for block in stage.layers]
    got, handles = {}, []
    for i, (_, block) in enumerate(blocks):
        attention = block.attention.attention
        for name, linear in (("q", attention.projection_query), ("k", attention.projection_key)):
            split = attention.rearrange_for_multi_head_attention
            handles.append(linear.register_forward_hook(lambda m, a, o, n=(name, i), f=split: got.__setitem__(n, f(o))))
        handles.append(block.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(("resid", i + 1), o)))
    out = model(pixel_values=pixel_values, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    scales = [block.attention.attention.scale for _, block in blocks]
    return blocks, got, scales, out.hidden_states


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_cvt_matches_its_own_projections(tmp_path):
    path = saved(tmp_path, transformers.CvtForImageClassification, cvt_config(), "cvt")
    pixel_values = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tables, loaded = run_extract(path, {"pixel_values": pixel_values}, batch_size=2)
    blocks, got, scales, maps = cvt_reference(path, pixel_values)
    qk, attention, stats = tables["qk"], tables["attention"], tables["hidden_stats"]
    assert qk.height == sum(loaded.geometry.layer_heads) == 1 + 2 * 2 + 3 * 4
    for layer, scale in enumerate(scales):
        q, k = got[("q", layer)].double(), got[("k", layer)].double()  # (B, H, T, d)
        assert k.shape[2] < q.shape[2]  # strided keys
        probs = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
        for head in range(q.shape[1]):
            row = qk.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            np.testing.assert_allclose(row["q_mean"], q[:, head].reshape(-1, q.shape[-1]).mean(0), atol=TOL)
            np.testing.assert_allclose(row["k_mean"], k[:, head].reshape(-1, k.shape[-1]).mean(0), atol=TOL)
            p = probs[:, head]
            row = attention.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            assert row["entropy_mean"] == pytest.approx(-(p * p.log()).sum(-1).mean().item(), abs=TOL)
    for layer in range(1, len(blocks) + 1):
        x = got[("resid", layer)].double().reshape(-1, got[("resid", layer)].shape[-1])
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == "resid")).row(0, named=True)
        assert row["n"] == x.shape[0]
        np.testing.assert_allclose(row["sum_x"], x.sum(0).numpy(), rtol=TOL, atol=TOL * x.shape[0])
    # each stage's last block gives transformers' stage output (`output_hidden_states`, the last without its [CLS]);
    # layer 0, stage 0's embedding, has as many cells
    assert len(maps) == 3
    cells = maps[0].double().flatten(2).transpose(1, 2)
    stage0 = stats.filter((pl.col("layer") == 0) & (pl.col("site") == "resid")).row(0, named=True)
    assert stage0["n"] == cells.shape[0] * cells.shape[1]
    ends = [i + 1 for i, (s, _) in enumerate(blocks) if i + 1 == len(blocks) or blocks[i + 1][0] != s]
    for stage, layer in enumerate(ends):
        x = got[("resid", layer)].double()
        expected = maps[stage].double().flatten(2).transpose(1, 2)
        assert torch.allclose(x[:, -expected.shape[1] :], expected, atol=1e-6)
