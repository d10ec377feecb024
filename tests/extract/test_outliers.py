"""What carries the anisotropy (issue 38), against brute force on tiny models of six families: the per-dimension
square sums and max |x| of hidden_stats, the top tokens of massive.parquet, the column sums of sinks.parquet and
sink_keys.parquet (eager attention's probabilities summed over the valid query rows), and the measures' rows from
them; then the planted rogue dimension, LayerNorm outlier, massive activation and attention sink recovered."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from planted import MASSIVE_DIM, ROGUE_DIM, SINK_HEAD, planted_batch, planted_gpt2
from test_extract import ARCHS, ENCODERS, reference

from anisweep.extract import attention_torch, outlier_tables
from anisweep.extract import tables as extract_tables
from anisweep.extract.attention_torch import Scratch, Workers, row_blocks
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.extract.streaming import TOP_K, VisibleKeys
from anisweep.measures import geometry, massive, rogue, sinks

from conftest import padded_batch, saved

FAMILIES = ("bert", "gpt_neox", "llama", "olmo", "olmo2", "gpt2")
IDENT = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}


def extract(path, batch, **settings):
    """extract's tables of the checkpoint at `path` (run sets the Recorder's token ids: the tables name tokens)."""
    settings = ExtractSettings(**{"batch_size": 2, "sample_tokens": 10_000, "device": "cpu", **settings})
    loaded = load_model(path, device="cpu")
    recorder = run(loaded, batch, settings, progress=False)
    return extract_tables.tables(recorder, loaded, IDENT)


def hidden_sites(ref, kind):
    sites = [(layer, "resid", x) for layer, x in enumerate(ref["resid"])]
    n_blocks = len(ref["resid"]) - 1
    return sites + [(n_blocks, "final_ln_in", ref["ln_in"]), (n_blocks, "final_ln_out", ref["ln_out"])]


def check_hidden(tables, ref, batch, kind):
    """hidden_stats' new sums, massive.parquet's top tokens and the rogue and massive rows, from the reference's
    hidden states by brute force (every pair of tokens, every component)."""
    valid = batch["attention_mask"].bool()
    first = valid.to(torch.uint8).argmax(dim=1)
    stats, top = tables["hidden_stats"], tables["massive"]
    samples = {
        (layer, site): np.stack(g.sort("seq", "position")["vector"].to_list()).astype(np.float64)
        for (layer, site), g in tables["hidden"].group_by("layer", "site")
    }
    rogue_rows = {(r["layer"], r["site"], r["metric"]): r["value"] for r in rogue.rogue_rows(stats, samples)}
    massive_rows = {(r["layer"], r["site"], r["metric"]): r["value"] for r in massive.massive_rows(stats, samples, top)}
    for layer, site, x in hidden_sites(ref, kind):
        xv = x[valid].double()
        n, d = xv.shape
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == site)).row(0, named=True)
        unit = xv / xv.norm(dim=-1, keepdim=True)
        np.testing.assert_allclose(row["sum_x_sq"], (xv**2).sum(0).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row["sum_unit_sq"], (unit**2).sum(0).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row["m2_x"], ((xv - xv.mean(0)) ** 2).sum(0).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row["abs_max"], xv.abs().amax(0).numpy(), rtol=1e-6)
        # each dimension's term of avg_cos, over every ordered pair of distinct tokens
        pairs = unit[:, None, :] * unit[None, :, :]
        pairs[torch.arange(n), torch.arange(n)] = 0.0
        brute = (pairs.sum(dim=(0, 1)) / (n * (n - 1))).numpy()
        c = rogue.contributions(row["sum_unit"], row["m2_unit"], row["n"])
        np.testing.assert_allclose(c, brute, atol=1e-6)
        assert c.sum() == pytest.approx(geometry.avg_cos(xv.numpy()), abs=1e-6)
        order = np.argsort(-brute)
        if brute.sum() > 0:
            share = np.cumsum(brute[order]) / brute.sum()
            assert rogue_rows[(layer, site, "rogue_top1_share")] == pytest.approx(share[0], abs=1e-5)
            assert rogue_rows[(layer, site, "rogue_top10_share")] == pytest.approx(share[9], abs=1e-5)
            assert rogue_rows[(layer, site, "rogue_dims_90")] == np.argmax(share >= 0.9 - 1e-9) + 1
        assert rogue_rows[(layer, site, "rogue_dim_1")] == order[0]
        z = (xv - xv.mean(0)) / xv.std(0, unbiased=False)
        standardised = rogue_rows[(layer, site, "avg_cos_standardised")]
        assert standardised == pytest.approx(geometry.avg_cos(z.numpy()), abs=1e-5)  # the sample is every token
        # the TOP_K tokens by their largest |component|, largest first
        token_max, token_dim = x.abs().max(dim=-1)
        token_max = token_max.masked_fill(~valid, -1.0)
        values, flat = token_max.flatten().topk(TOP_K + 1)
        kept = top.filter((pl.col("layer") == layer) & (pl.col("site") == site)).sort("rank")
        np.testing.assert_allclose(kept["value"].to_numpy(), values[:TOP_K].numpy(), rtol=1e-6)
        seqs, positions = (flat // x.shape[1]).tolist(), (flat % x.shape[1]).tolist()
        distinct = np.diff(values.numpy()) < -1e-6 * values.numpy()[1:]  # ties (one token twice) in either order
        for rank, (seq, position) in enumerate(zip(seqs[:TOP_K], positions[:TOP_K])):
            if (rank == 0 or distinct[rank - 1]) and distinct[rank]:
                got = kept.row(rank, named=True)
                assert (got["seq"], got["position"]) == (seq, position)
                assert got["dim"] == int(token_dim[seq, position])
                assert got["token_id"] == int(batch["input_ids"][seq, position])
                assert (got["kind"] == "first") == (position == int(first[seq]))
        median = float(np.median(xv.abs().numpy()))
        assert massive_rows[(layer, site, "massive_max")] == pytest.approx(float(xv.abs().max()), rel=1e-6)
        assert massive_rows[(layer, site, "massive_ratio")] == pytest.approx(float(xv.abs().max()) / median, rel=1e-5)


def check_sinks(tables, ref, batch):
    """sinks.parquet, sink_keys.parquet and the attention_sinks rows from eager attention's probabilities."""
    valid = batch["attention_mask"].bool()
    rows_per_seq = valid.sum(1)
    sink_table, keys = tables["sinks"], tables["sink_keys"]
    measured = {
        (r["layer"], r["head"], r["metric"]): r["value"]
        for r in sinks.sink_rows(sink_table, keys, tables["attention"])
        if r.get("head") is not None
    }
    for layer, probs in enumerate(ref["attentions"]):
        p = torch.where(valid[:, None, :, None], probs.double(), 0.0)
        colsum = p.sum(dim=2)  # (B, H, T): what each key receives from its sequence's valid rows
        for head in range(probs.shape[1]):
            row = sink_table.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            assert row["n_rows"] == int(valid.sum())
            assert row["first_received"] == pytest.approx(float(colsum[:, head, 0].sum()), abs=1e-5)
            np.testing.assert_allclose(row["received"], colsum[:, head].sum(0).numpy(), atol=1e-5)
            assert row["key_count"] == valid.sum(0).tolist()
            # Gu et al. 2024's first-token importance, each sequence's own valid rows
            importance = colsum[:, head, 0] / rows_per_seq
            np.testing.assert_allclose(row["first_importance"], importance.numpy(), atol=1e-6)
            first_mass = float(p[:, head, :, 0].sum()) / int(valid.sum())
            row_max = float(p[:, head].amax(-1).sum()) / int(valid.sum())
            assert measured[(layer, head, "sink_first_mass")] == pytest.approx(first_mass, abs=1e-6)
            assert measured[(layer, head, "sink_row_max_mass")] == pytest.approx(row_max, abs=1e-5)
            received, flat = colsum[:, head].masked_fill(~valid, -1.0).flatten().topk(TOP_K)
            kept = keys.filter((pl.col("layer") == layer) & (pl.col("head") == head)).sort("rank")
            np.testing.assert_allclose(kept["received"].to_numpy(), received.numpy(), atol=1e-5)
            seqs = (flat // valid.shape[1]).numpy()
            np.testing.assert_allclose(
                kept["share"].to_numpy(), received.numpy() / rows_per_seq[seqs].numpy(), atol=1e-5
            )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", FAMILIES)
def test_outlier_tables_and_measures_match_brute_force(tmp_path, kind):
    """BERT, GPT-NeoX, Llama, OLMo, OLMo 2 and GPT-2 (padding, mini-batches of 2 sequences: the top lists merge
    across them) against eager attention and the hidden states by brute force."""
    lm, _, config = ARCHS[kind]
    path = saved(tmp_path, lm, config(), kind)
    batch = padded_batch()
    tables = extract(path, batch)
    ref = reference(path, batch, kind)
    check_hidden(tables, ref, batch, kind)
    check_sinks(tables, ref, batch)
    assert set(tables["sinks"]["layer"]) == set(range(len(ref["attentions"])))
    assert kind in ENCODERS or tables["sinks"]["n_rows"][0] == int(batch["attention_mask"].sum())


def rows_of(tables) -> dict:
    samples = {
        (layer, site): np.stack(g["vector"].to_list()).astype(np.float64)
        for (layer, site), g in tables["hidden"].group_by("layer", "site")
    }
    out = rogue.rogue_rows(tables["hidden_stats"], samples)
    out += massive.massive_rows(tables["hidden_stats"], samples, tables["massive"])
    out += sinks.sink_rows(tables["sinks"], tables["sink_keys"], tables["attention"])
    from anisweep.measures.ln_outliers import ln_outlier_rows

    out += ln_outlier_rows(tables["layernorm"], tables["hidden_stats"])
    return {(r["layer"], r.get("head"), r["site"], r["metric"]): r["value"] for r in out}


def test_planted_outliers_are_recovered(tmp_path):
    """The planted GPT-2 against the same model without the plants: the rogue dimension and LayerNorm outlier at
    ROGUE_DIM after the final norm, the massive activation at MASSIVE_DIM on MASSIVE_TOKEN (the config's eos: a
    delimiter, or the first token), the attention sink on the first key in head SINK_HEAD of block 0."""
    batch = planted_batch()
    planted = rows_of(extract(planted_gpt2(tmp_path, "planted"), batch))
    plain = rows_of(extract(planted_gpt2(tmp_path, "plain", strength=0.0), batch))
    out = (2, None, "final_ln_out")
    assert planted[(*out, "rogue_dim_1")] == ROGUE_DIM
    assert planted[(*out, "rogue_top1_share")] > 0.9 > plain[(*out, "rogue_top1_share")]
    assert planted[(*out, "rogue_dims_90")] == 1 < plain[(*out, "rogue_dims_90")]
    assert planted[(*out, "avg_cos_standardised")] < 0.1 * planted[(*out, "avg_cos_sample")]
    assert planted[(2, None, "final_ln", "ln_gain_outlier_dim_1")] == ROGUE_DIM
    assert planted[(2, None, "final_ln", "ln_rogue_1_is_outlier")] == 1.0
    assert plain[(2, None, "final_ln", "ln_gain_outliers")] == 0.0
    embed = (0, None, "resid")
    assert planted[(*embed, "massive_dim_1")] == MASSIVE_DIM
    assert planted[(*embed, "massive_ratio")] > 1000 > 20 > plain[(*embed, "massive_ratio")]
    assert planted[(*embed, "massive_top1_dim")] == MASSIVE_DIM
    assert planted[(*embed, "massive_top_delimiter_share")] == 3 / TOP_K  # three of the four MASSIVE_TOKENs
    assert plain[(*embed, "massive_dim_1")] != MASSIVE_DIM
    sink = (0, SINK_HEAD, "attention")
    assert planted[(*sink, "sink_first_mass")] > 0.7 > 0.5 > plain[(*sink, "sink_first_mass")]
    assert planted[(*sink, "sink_top_key_position")] == 0
    assert planted[(*sink, "sink_top_key_share")] == pytest.approx(1.0, abs=1e-3)
    others = [planted[(0, h, "attention", "sink_first_mass")] for h in range(4) if h != SINK_HEAD]
    assert max(others) < planted[(*sink, "sink_first_mass")]


@pytest.mark.parametrize("causal", [False, True])
def test_torch_path_column_sums_over_threads_and_row_blocks(causal):
    """The CPU path's column sums with worker threads and several causal row blocks (each its own partial sum)."""
    g = torch.Generator().manual_seed(0)
    b, h, t, d = 3, 2, 80, 8
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    valid = torch.arange(t)[None, :] < torch.tensor([t, 50, 1])[:, None]
    hidden = ~valid[:, None, :].expand(b, t, t)
    if causal:
        hidden = hidden | torch.ones(t, t, dtype=torch.bool).triu(1)
    blocks = [
        (rows, [VisibleKeys.build(s[rows, : (rows.stop if causal else t)]) for s in hidden])
        for rows in row_blocks(t, causal)
    ]
    assert len(blocks) == (3 if causal else 1)
    workers = Workers(2)
    try:
        _, _, colsum = attention_torch.attend(q, k, v, 0.5, blocks, False, workers, Scratch(), valid=valid)
    finally:
        workers.close()
    scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(hidden[:, None], -torch.inf)
    p = torch.where(valid[:, None, :, None], scores.softmax(-1), 0.0)
    np.testing.assert_allclose(colsum.numpy(), p.sum(dim=2).numpy(), atol=1e-5)


def test_token_kinds():
    """First token by position; delimiters by the config's special ids or a punctuation / whitespace text."""

    class Config:
        eos_token_id, bos_token_id, sep_token_id = 2, None, [3]

    class Tokenizer:
        def decode(self, ids):
            return {4: ".", 5: "\n", 6: " the", 7: ""}[ids[0]]

    kinds = outlier_tables.TokenKinds(torch.tensor([[2, 3, 4, 5, 6, 7]]), Config(), Tokenizer())
    got = [kinds.describe(0, position, first=position == 0)["kind"] for position in range(6)]
    assert got == ["first", "delimiter", "delimiter", "delimiter", "other", "other"]
    assert kinds.describe(0, 9, False) == {"token_id": None, "token": None, "kind": "other"}
    blind = outlier_tables.TokenKinds(None, Config())
    assert blind.describe(0, 1, False)["kind"] == "other"


@pytest.mark.parametrize("wait_free", [False, True])
def test_vector_outlier_statistics_over_mini_batches_with_bad_tokens(wait_free):
    """Both ways of summing (the CPU's branches, the GPU's masks): the square sums, max |x_j| and top tokens over
    three mini-batches with padding, a NaN token, an inf token and a zero vector, against numpy on the valid finite
    tokens; sequence numbers run on across mini-batches."""
    from anisweep.extract.streaming import VectorStats

    g = torch.Generator().manual_seed(3)
    stats, kept, where = VectorStats(6), [], []
    for b in range(3):
        x = torch.randn(2, 5, 6, generator=g) * (1 + b)
        valid = torch.rand(2, 5, generator=g) > 0.2
        valid[:, 0] = True
        if b == 1:
            x[0, 2, 1], x[1, 3, 4], x[1, 1] = float("nan"), float("inf"), 0.0
            valid[0, 2] = valid[1, 3] = valid[1, 1] = True
        stats.add(VectorStats.partial(x, valid, wait_free=wait_free, outliers=True))
        for seq in range(2):
            for pos in range(5):
                if valid[seq, pos] and torch.isfinite(x[seq, pos]).all():
                    kept.append(x[seq, pos].double().numpy())
                    where.append((2 * b + seq, pos))
    kept = np.stack(kept)
    norms = np.linalg.norm(kept, axis=1)
    unit = kept[norms > 0] / norms[norms > 0, None]
    np.testing.assert_allclose(stats.sum_x_sq.numpy(), (kept**2).sum(0), rtol=1e-6)
    np.testing.assert_allclose(stats.sum_unit_sq.numpy(), (unit**2).sum(0), rtol=1e-6)
    np.testing.assert_allclose(stats.m2_x.numpy(), ((kept - kept.mean(0)) ** 2).sum(0), rtol=1e-12)
    np.testing.assert_allclose(stats.m2_unit.numpy(), ((unit - unit.mean(0)) ** 2).sum(0), rtol=1e-12)
    np.testing.assert_allclose(stats.abs_max.numpy(), np.abs(kept).max(0), rtol=1e-6)
    top = stats.top_tokens()
    order = np.argsort(-np.abs(kept).max(1), kind="stable")[:TOP_K]
    np.testing.assert_allclose(top["value"], np.abs(kept).max(1)[order], rtol=1e-6)
    assert list(zip(top["seq"], top["position"])) == [where[i] for i in order]
    assert top["dim"] == np.abs(kept).argmax(1)[order].tolist()
    assert top["first"] == [int(where[i][1] == 0) for i in order]


def test_bert_special_tokens_are_delimiters_from_its_tokenizer(tmp_path):
    """Issue 43: a BERT's config.json names no sep_token_id (BertConfig has pad_token_id only), so its [SEP], the
    key Clark et al. (2019) find heads attending to, counted as `other` in sink_keys and massive. The tokenizer's
    special tokens are delimiters now: every [SEP] named in either table is one; [UNK] and [MASK] are not."""
    from transformers import BertConfig, BertModel

    from anisweep.toy.tokenizers import build_bert_tokenizer

    tokenizer = build_bert_tokenizer(["the cat sat on the mat. a dog ran in the park, and sat"], vocab_size=80)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    assert getattr(config, "sep_token_id", None) is None
    path = saved(tmp_path, BertModel, config, "bert")
    tokenizer.save_pretrained(path)
    words = tokenizer(["the cat sat", "a dog ran"], ["on the mat", "in the park"], padding=True, return_tensors="pt")
    batch = {"input_ids": words["input_ids"], "attention_mask": words["attention_mask"]}
    tables = extract(path, batch)
    sep = tokenizer.sep_token_id
    assert (batch["input_ids"] == sep).sum() == 4
    named = pl.concat([tables[name].select("token_id", "kind") for name in ("sink_keys", "massive")])
    seps = named.filter(pl.col("token_id") == sep)
    assert seps.height and set(seps["kind"]) == {"delimiter"}
    kinds = outlier_tables.TokenKinds(None, config, tokenizer)
    assert {tokenizer.cls_token_id, sep, tokenizer.pad_token_id} <= kinds.special
    assert not {tokenizer.unk_token_id, tokenizer.mask_token_id} & kinds.special
    # GPT-NeoX's <|endoftext|> is its bos, eos, unk and pad token at once: a delimiter, as its eos
    neox = type("Tokenizer", (), {"all_special_ids": [0], "unk_token_id": 0, "eos_token_id": 0, "bos_token_id": 0})
    assert outlier_tables.tokenizer_delimiters(neox()) == {0}
