"""Toy checkpoint training: exact steps, loadable checkpoints, determinism, Pythia-like NeoX."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from anisweep.corpus import builtin_text, tokenize_stream
from anisweep.toy.tokenizers import build_bert_tokenizer
from anisweep.toy.train import DEFAULT_STEPS, ToySpec, _Batches, _save_checkpoint, build_model, train_toy, training_loss

STEPS = [0, 1, 5, 30]
TINY = ToySpec(d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=32, batch_size=8, lr=5e-3, vocab_size=400, warmup=3)


def _texts():
    return builtin_text()[:500]


def _run(arch: str, out: Path, seed: int = 0) -> Path:
    return train_toy(arch, out, STEPS, seed, TINY, texts=_texts(), num_threads=1, progress=False)


@pytest.fixture(scope="module", params=["bert", "gpt_neox"])
def runs(request, tmp_path_factory):
    arch = request.param
    base = tmp_path_factory.mktemp(arch)
    a = _run(arch, base / "a")
    b = _run(arch, base / "b")
    return arch, a, b


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_the_training_corpus_token_counts_are_written_beside_the_checkpoints(runs):
    """token_counts.parquet is the count of every token id in the training stream (the gradient analysis's strata
    read it: anisweep.tangent.batch.read_token_counts, from a checkpoint folder's run folder)."""
    from transformers import AutoTokenizer

    from anisweep.tangent.batch import read_token_counts

    _, out, _ = runs
    tokenizer = AutoTokenizer.from_pretrained(out / "step0")
    stream = tokenize_stream(tokenizer, _texts())
    counts = read_token_counts(out / "step0")
    expected = torch.bincount(torch.as_tensor(stream).reshape(-1), minlength=len(tokenizer)).numpy()
    assert counts is not None and (counts == expected).all()


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_checkpoints_at_exact_steps(runs):
    _, out, _ = runs
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"step{s}" for s in STEPS] + ["token_counts.parquet", "train_log.json"]
    )
    for s in STEPS:
        assert (out / f"step{s}" / "model.safetensors").is_file()
        assert (out / f"step{s}" / "config.json").is_file()
        assert (out / f"step{s}" / "tokenizer.json").is_file()


def test_checkpoints_load_with_auto_classes(runs):
    from transformers import AutoModel, AutoTokenizer

    arch, out, _ = runs
    for s in (STEPS[0], STEPS[-1]):
        model = AutoModel.from_pretrained(out / f"step{s}")
        tok = AutoTokenizer.from_pretrained(out / f"step{s}")
        assert type(model).__name__ == ("BertModel" if arch == "bert" else "GPTNeoXModel")
        enc = tok(["the assert statement", "a list"], return_tensors="pt", padding=True)
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state
        assert hidden.shape[-1] == TINY.d_model and torch.isfinite(hidden).all()
        if arch == "bert":
            assert enc["input_ids"][0, 0] == tok.cls_token_id and tok.mask_token is not None
        else:
            assert tok.eos_token is not None and tok.pad_token_id == tok.eos_token_id


def test_training_changes_weights_and_is_deterministic(runs):
    _, a, b = runs
    first, last = load_file(a / "step0" / "model.safetensors"), load_file(a / f"step{STEPS[-1]}" / "model.safetensors")
    assert first.keys() == last.keys()
    assert any(not torch.equal(first[k], last[k]) for k in first)
    for s in STEPS:
        assert _digest(a / f"step{s}") == _digest(b / f"step{s}"), f"step{s} differs between identical runs"
        assert (a / f"step{s}" / "tokenizer.json").read_bytes() == (b / f"step{s}" / "tokenizer.json").read_bytes()


def test_other_seed_differs(runs, tmp_path):
    arch, a, _ = runs
    c = train_toy(arch, tmp_path / "c", [0], 1, TINY, texts=_texts(), num_threads=1, progress=False)
    assert _digest(c / "step0") != _digest(a / "step0")


def test_train_log_and_loss_falls(runs):
    arch, out, _ = runs
    log = json.loads((out / "train_log.json").read_text())
    assert log["arch"] == arch and log["tokens_per_step"] == TINY.batch_size * TINY.seq_len
    assert [r["step"] for r in log["log"]] == list(range(1, STEPS[-1] + 1))
    assert log["log"][-1]["tokens_seen"] == STEPS[-1] * TINY.batch_size * TINY.seq_len
    losses = [r["loss"] for r in log["log"]]
    assert losses[0] == pytest.approx(torch.log(torch.tensor(float(log["vocab_size"]))).item(), abs=0.5)
    # tiny MLM batches hold ~40 targets: noisy, so compare the mean of the last 10 steps
    assert sum(losses[-10:]) / 10 < losses[0] - 0.3


def test_neox_is_pythia_like(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    out = train_toy("gpt_neox", tmp_path, [0], 0, TINY, texts=_texts(), num_threads=1, progress=False)
    config = AutoConfig.from_pretrained(out / "step0")
    assert config.model_type == "gpt_neox"
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert config.use_parallel_residual is True
    assert config.tie_word_embeddings is False
    model = AutoModelForCausalLM.from_pretrained(out / "step0")
    emb_in, emb_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb_in.data_ptr() != emb_out.data_ptr() and not torch.equal(emb_in, emb_out)
    # saved under Pythia's names (transformers 5 calls the output layer lm_head in memory)
    keys = load_file(out / "step0" / "model.safetensors").keys()
    assert {"gpt_neox.embed_in.weight", "embed_out.weight"} <= set(keys)


def test_mlm_masking_statistics():
    texts = _texts()
    tok = build_bert_tokenizer(texts, 400)
    spec = ToySpec(seq_len=64, batch_size=256)
    batches = _Batches("bert", tok, tokenize_stream(tok, texts), spec, torch.Generator().manual_seed(0))
    batch = batches.next()
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (256, 64)
    target = labels != -100
    special = torch.isin(labels.where(target, ids), torch.tensor(tok.all_special_ids))
    assert not bool((target & special).any())
    assert not bool(target[:, 0].any()) and not bool(target[:, -1].any())  # [CLS] / [SEP]
    frac = target.float().mean().item()
    assert 0.12 < frac < 0.16
    masked = (ids == tok.mask_token_id) & target
    kept = (ids == labels) & target
    assert masked.sum() / target.sum() == pytest.approx(0.8, abs=0.03)
    assert kept.sum() / target.sum() == pytest.approx(0.1, abs=0.03)
    assert not bool(((ids == tok.mask_token_id) & ~target).any())


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_training_loss_is_the_models_own_loss_and_gradient(arch):
    """BERT's head runs on the masked targets alone in training: the loss and every parameter's gradient are those
    of BertForMaskedLM's own forward on the whole batch."""
    from anisweep.toy.tokenizers import build_tokenizer

    texts = _texts()
    tokenizer = build_tokenizer(arch, texts, TINY.vocab_size)
    torch.manual_seed(0)
    model = build_model(arch, TINY, tokenizer)
    batch = _Batches(arch, tokenizer, tokenize_stream(tokenizer, texts), TINY, torch.Generator().manual_seed(0)).next()
    if arch == "bert":
        assert 0 < int((batch["labels"] != -100).sum()) < batch["labels"].numel() // 4
    parameters = [p for p in model.parameters() if p.requires_grad]
    own = model(**batch).loss
    expected = torch.autograd.grad(own, parameters, allow_unused=True)
    loss = training_loss(arch, model, batch)
    got = torch.autograd.grad(loss, parameters, allow_unused=True)
    assert loss.item() == pytest.approx(own.item(), rel=1e-6)
    for want, have in zip(expected, got):
        assert (want is None) == (have is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-7)


def test_atomic_checkpoint_replace(tmp_path):
    from transformers import BertConfig, BertModel

    tok = build_bert_tokenizer(_texts(), 200)
    config = BertConfig(
        vocab_size=len(tok), hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    model = BertModel(config)
    final = tmp_path / "step3"
    final.mkdir()
    (final / "stale.txt").write_text("half-written")
    _save_checkpoint(model, tok, final)
    assert not (final / "stale.txt").exists() and (final / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["step3"]  # no temporary siblings left


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="arch"):
        train_toy("gpt2", tmp_path, [0], 0)
    with pytest.raises(ValueError, match="divisible"):
        train_toy("bert", tmp_path, [0], 0, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="steps"):
        train_toy("bert", tmp_path, [], 0)
    with pytest.raises(TypeError):
        train_toy("bert", tmp_path, [0], 0, not_a_field=1)


def test_defaults():
    spec = ToySpec()
    assert DEFAULT_STEPS[0] == 0 and DEFAULT_STEPS[-1] <= 1000
    assert 64 <= spec.d_model <= 128 and 2 <= spec.n_layers <= 4 and spec.n_heads == 4 and spec.seq_len == 64
    assert spec.tokens_per_step == spec.batch_size * spec.seq_len
