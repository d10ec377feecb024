"""CANINE against Hugging Face's eager forward: the deep stack on the downsampled (molecule) sequence, masked as
CANINE masks it, its attention statistics recomputed by hooks on the modules that compute attention themselves."""

from __future__ import annotations

import polars as pl
import pytest
import torch
import transformers
from test_extract import check_all

from anisweep.adapters import adapter_for

from conftest import canine_config, run_extract, saved

RATE, N_LAYERS = 4, 2


def char_batch(lengths=(18, 7, 18, 3, 10), t=18, seed=0):
    """Code points as CANINE's tokenizer gives them ([CLS] = 0xE000 first), right-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(32, 0x3000, (len(lengths), t), generator=g)
    ids[:, 0] = 0xE000
    mask = torch.ones(len(lengths), t, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, length:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@torch.no_grad()
def canine_reference(path, batch):
    """Eager CANINE: the deep stack's hidden states (transformers' hidden_states[2 : 2 + L + 1]: after the initial
    character encoder's two) and attention maps (attentions[1 : 1 + L]), q and k from the deep layers' own
    projections of their input."""
    model = transformers.CanineModel.from_pretrained(path, attn_implementation="eager").eval()
    n_heads = model.config.num_attention_heads
    captured = {}
    final = model.encoder.layer[-1].output.LayerNorm
    handle = final.register_forward_hook(lambda m, a, o: captured.update(ln_in=a[0], ln_out=o))
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    handle.remove()
    deep = out.hidden_states[2 : 2 + N_LAYERS + 1]
    assert all(h.shape[1] == batch["input_ids"].shape[1] // RATE for h in deep)
    q, k = {}, {}
    for layer in range(N_LAYERS):
        att = model.encoder.layer[layer].attention.self
        b, t, _ = deep[layer].shape
        q[(layer, "pre")] = att.query(deep[layer]).view(b, t, n_heads, -1).transpose(1, 2)
        k[(layer, "pre")] = att.key(deep[layer]).view(b, t, n_heads, -1).transpose(1, 2)
    return dict(
        attentions=out.attentions[1 : 1 + N_LAYERS],
        q=q,
        k=k,
        resid=list(deep),
        ln_in=captured["ln_in"],
        ln_out=captured["ln_out"],
        d=model.config.hidden_size // n_heads,
        scaling=[(model.config.hidden_size // n_heads) ** -0.5] * N_LAYERS,
    )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("batch_size", [2, 5])
def test_canine_deep_stack_matches_eager_reference(tmp_path, batch_size):
    path = saved(tmp_path, transformers.CanineModel, canine_config(), "canine")
    batch = char_batch()
    tables, loaded = run_extract(path, batch, batch_size=batch_size)
    ids, mask = loaded.adapter.recorded_positions(loaded.model.config, batch["input_ids"], batch["attention_mask"])
    molecules = {"input_ids": ids, "attention_mask": mask}
    check_all(tables, canine_reference(path, batch), molecules, causal=False)
    assert tables["embeddings"].is_empty()  # hashed embeddings: no one matrix to measure


def test_canine_molecules_are_masked_and_labelled_as_canine_pools_them():
    """A molecule is valid where any of its 4 characters is (max-pool, the remainder dropped); its token id is the
    first character its window holds, [CLS] for molecule 0."""
    adapter = adapter_for(canine_config())
    ids = torch.arange(100, 118)[None].expand(3, -1)
    mask = torch.zeros(3, 18, dtype=torch.long)
    for i, length in enumerate((18, 5, 4)):
        mask[i, :length] = 1
    mol_ids, mol_mask = adapter.recorded_positions(canine_config(), ids, mask)
    assert mol_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert mol_ids[0].tolist() == [100, 100, 104, 108]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_canine_hidden_sample_is_of_molecules(tmp_path):
    path = saved(tmp_path, transformers.CanineModel, canine_config(), "canine")
    tables, _ = run_extract(path, char_batch())
    hidden = tables["hidden"].filter((pl.col("layer") == 0) & (pl.col("site") == "resid"))
    assert hidden["position"].max() < 18 // RATE
    assert hidden.height == 4 + 2 + 4 + 1 + 3  # valid molecules of lengths 18, 7, 18, 3, 10
