"""Tiny models with what the outlier measures look for planted in their weights, so that a test can fail: a rogue
dimension and LayerNorm outlier (the final norm's gain and bias at ROGUE_DIM), a massive activation (a token's
embedding at MASSIVE_DIM) and an attention sink (block 0's head SINK_HEAD looks at the first position).

Shared by tests/extract/test_outliers.py, tests/measures/test_outlier_measures.py and tests/plots (``from planted
import ...``: pytest puts tests/ on sys.path, as for conftest.py)."""

from __future__ import annotations

import torch
import transformers

from conftest import gpt2_config

ROGUE_DIM = 3
MASSIVE_DIM = 5
MASSIVE_TOKEN = 7  # the token whose embedding carries the massive activation; the config's eos: a delimiter
SINK_HEAD = 0


def planted_gpt2(tmp_path, name: str = "planted", strength: float = 1.0, seed: int = 1):
    """A saved tiny GPT-2 (no scaling by layer) with every plant at `strength` (0: none)."""
    config = gpt2_config(eos_token_id=MASSIVE_TOKEN, bos_token_id=MASSIVE_TOKEN)
    config.scale_attn_by_inverse_layer_idx = False
    torch.manual_seed(seed)
    model = transformers.GPT2Model(config)
    d, d_head = config.n_embd, config.n_embd // config.n_head
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
        if strength:
            # rogue dimension and LayerNorm outlier: the final norm scales and shifts one coordinate far beyond the rest
            model.ln_f.weight[ROGUE_DIM] = 1.0 + 30.0 * strength
            model.ln_f.bias[ROGUE_DIM] = 20.0 * strength
            # massive activation: one token's embedding holds a huge value at one coordinate
            model.wte.weight[MASSIVE_TOKEN, MASSIVE_DIM] = 400.0 * strength
            # attention sink: position 0's embedding points along coordinate 0, head 0's keys read that coordinate
            # and its queries carry a constant bias along the same key direction, so every row scores key 0 highest
            model.wpe.weight[0] = 0.0
            model.wpe.weight[0, 0] = 30.0
            attn = model.h[0].attn.c_attn  # Conv1D: (d, 3d), columns [Q | K | V], head h at h*d_head
            key_col = d + SINK_HEAD * d_head
            attn.weight[:, key_col] = 0.0
            attn.weight[0, key_col] = 1.0
            attn.bias[key_col] = 0.0
            attn.weight[:, SINK_HEAD * d_head] = 0.0
            attn.bias[SINK_HEAD * d_head] = 12.0 * strength
    path = tmp_path / name
    model.save_pretrained(path)
    return path


def planted_batch(n: int = 5, t: int = 12, seed: int = 0) -> dict:
    """Right-padded ids (as conftest.padded_batch) with MASSIVE_TOKEN at a few places, one of them position 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 60, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.long)
    for i, length in enumerate([t, 7, t, 3, 10][:n]):
        mask[i, length:] = 0
    ids[0, 4] = ids[2, 0] = ids[2, 9] = ids[4, 6] = MASSIVE_TOKEN
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


__all__ = ["MASSIVE_DIM", "MASSIVE_TOKEN", "ROGUE_DIM", "SINK_HEAD", "planted_batch", "planted_gpt2"]
