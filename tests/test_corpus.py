"""Evaluation corpus: sources, and fixed token batches cut from them."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from anisweep import corpus
from anisweep.corpus import (
    builtin_text,
    corpus_stats,
    load_texts,
    make_batch,
    special_affixes,
    tokenize_stream,
    zipf_exponent,
)

N_WORDS = 4000
WORDS_PER_DOC = 40


def wordlevel_tokenizer(style: str):
    """A tokenizer in which every word "t{i}" is its own token, so stream positions are identifiable.

    style "bert": [CLS] $A [SEP] template, sep (no eos) between documents;
    style "neox": no template, <|endoftext|> as eos/pad between documents.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if style == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    else:
        specials = ["<|endoftext|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    vocab.update({f"t{i}": len(specials) + i for i in range(N_WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[1] if style == "bert" else specials[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


def numbered_docs(n_docs: int = N_WORDS // WORDS_PER_DOC) -> list[str]:
    return [" ".join(f"t{d * WORDS_PER_DOC + i}" for i in range(WORDS_PER_DOC)) for d in range(n_docs)]


@pytest.fixture(scope="module", params=["bert", "neox"])
def wl(request):
    return request.param, wordlevel_tokenizer(request.param)


@pytest.fixture(scope="module")
def toy_tokenizers():
    from anisweep.toy.tokenizers import build_bert_tokenizer, build_neox_tokenizer

    texts = builtin_text()[:600]
    return {"bert": build_bert_tokenizer(texts, 600), "neox": build_neox_tokenizer(texts, 600)}


# --------------------------------------------------------------------------- builtin corpus


def test_builtin_text_is_deterministic_language():
    texts = builtin_text()
    assert texts == builtin_text()
    assert len(texts) > 1000 and all(t.strip() for t in texts)
    stats = corpus_stats(texts)
    assert stats["characters"] > 300_000
    assert stats["words"] > 50_000
    # Zipf: word frequency ~ 1 / rank^s with s near 1
    assert 0.8 < stats["zipf_exponent"] < 1.3
    # reST heading underlines are dropped
    assert not any(re.fullmatch(r"\*{3,}", line) for t in texts for line in t.splitlines())


def test_zipf_exponent_of_exact_zipf_law():
    words = ["word" + "abcdefghijklmnopqrst"[r % 20] * (r // 20 + 1) for r in range(200)]
    docs = [" ".join([w] * (10_000 // (r + 1))) for r, w in enumerate(words)]
    assert zipf_exponent(docs, max_rank=200) == pytest.approx(1.0, abs=0.02)


def test_builtin_text_without_pydoc_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)
    corpus._builtin_paragraphs.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="pydoc_data"):
            builtin_text()
    finally:
        corpus._builtin_paragraphs.cache_clear()


# --------------------------------------------------------------------------- load_texts


def test_load_texts_sources(tmp_path):
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("First paragraph\nstill first.\n\nSecond paragraph.\n   \n\nThird: café.\n", encoding="utf-8")
    b.write_text("Other file.\n", encoding="utf-8")
    docs = load_texts({"source": "text", "paths": [str(a), b]})
    assert docs == ["First paragraph\nstill first.", "Second paragraph.", "Third: café.", "Other file."]
    assert load_texts({"source": "text", "paths": [a], "split": "line"})[:2] == ["First paragraph", "still first."]
    assert len(load_texts({"source": "text", "paths": str(a), "split": "file"})) == 1
    assert load_texts({"source": "builtin"}) == builtin_text()


def test_load_texts_errors(tmp_path, monkeypatch):
    missing = tmp_path / "nope" / "missing.txt"
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_texts({"source": "text", "paths": [str(missing)]})
    with pytest.raises(ValueError, match="paths"):
        load_texts({"source": "text", "paths": []})
    with pytest.raises(ValueError, match="builtin"):
        load_texts({"source": "wikipedia"})
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install datasets"):
        load_texts({"source": "hf_dataset", "name": "Salesforce/wikitext", "config": "wikitext-2-raw-v1"})


# --------------------------------------------------------------------------- make_batch


def test_special_affixes(wl, toy_tokenizers):
    style, tok = wl
    if style == "bert":
        assert special_affixes(tok) == ([2], [3])
        assert special_affixes(toy_tokenizers["bert"]) == (
            [toy_tokenizers["bert"].cls_token_id],
            [toy_tokenizers["bert"].sep_token_id],
        )
    else:
        assert special_affixes(tok) == ([], [])
        assert special_affixes(toy_tokenizers["neox"]) == ([], [])


def test_windows_are_nonoverlapping_slices(wl):
    style, tok = wl
    texts = numbered_docs()
    n, seq_len = 12, 48
    batch = make_batch(tok, texts, n, seq_len, seed=3, shuffle_documents=False)
    ids = batch["input_ids"]
    assert ids.shape == (n, seq_len) and ids.dtype == torch.int64
    assert batch["attention_mask"].dtype == torch.int64 and bool((batch["attention_mask"] == 1).all())
    n_special = 2 if style == "bert" else 0
    if style == "bert":
        assert bool((ids[:, 0] == 2).all()) and bool((ids[:, -1] == 3).all())
        assert not bool((ids[:, 1:] == 2).any())  # [CLS] only in front
        content = ids[:, 1:-1]
    else:
        content = ids
    # each window is a contiguous slice of the (unshuffled) stream, and slices do not overlap
    stream = tokenize_stream(tok, texts)
    sep = tok.sep_token_id if style == "bert" else tok.eos_token_id
    assert sep in stream  # documents are separated
    pos = {t: i for i, t in enumerate(stream) if t != sep}
    spans = []
    for row in content.tolist():
        first = next(i for i, t in enumerate(row) if t != sep)
        start = pos[row[first]] - first
        assert stream[start : start + len(row)] == row
        spans.append((start, start + seq_len - n_special))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_windows_deterministic_and_seeded(wl):
    _, tok = wl
    texts = numbered_docs()
    a = make_batch(tok, texts, 8, 32, seed=0)
    b = make_batch(tok, texts, 8, 32, seed=0)
    c = make_batch(tok, texts, 8, 32, seed=1)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], c["input_ids"])
    # unique words: no word token appears in two windows even with shuffled documents
    words = [t for t in a["input_ids"].flatten().tolist() if t >= 5]
    assert len(words) == len(set(words))


def test_real_tokenizers_special_token_layout(toy_tokenizers):
    texts = builtin_text()
    bert, neox = toy_tokenizers["bert"], toy_tokenizers["neox"]
    ids = make_batch(bert, texts, 16, 64, seed=0)["input_ids"]
    assert ids.shape == (16, 64)
    assert bool((ids[:, 0] == bert.cls_token_id).all()) and bool((ids[:, -1] == bert.sep_token_id).all())
    assert not bool((ids[:, 1:] == bert.cls_token_id).any())
    assert not bool((ids == bert.pad_token_id).any())
    ids = make_batch(neox, texts, 16, 64, seed=0)["input_ids"]
    assert ids.shape == (16, 64)
    # no special tokens added: the eos appears only as a document separator, and not in every row
    assert int((ids == neox.eos_token_id).sum()) < ids.numel() // 8
    assert not bool((ids[:, 0] == neox.eos_token_id).all())


def test_too_short_corpus_names_the_numbers(wl):
    style, tok = wl
    texts = numbered_docs(2)[:1]  # 40 tokens, no separators
    with pytest.raises(ValueError) as err:
        make_batch(tok, texts, 4, 22, seed=0)
    msg = str(err.value)
    content = 20 if style == "bert" else 22
    assert "40 tokens" in msg
    assert "4 x 22" in msg and str(4 * content) in msg
    assert "n_sequences" in msg and "seq_len" in msg and "add text" in msg
    with pytest.raises(ValueError, match="special tokens" if style == "bert" else "no room"):
        make_batch(tok, texts, 1, 2 if style == "bert" else 0, seed=0)


class CountingTokenizer:
    """Delegates to a tokenizer and counts the documents it was asked to encode in batches."""

    def __init__(self, tok):
        self._tok = tok
        self.n_docs = 0

    def __call__(self, texts, **kwargs):
        if isinstance(texts, list):
            self.n_docs += len(texts)
        return self._tok(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_lazy_tokenization(wl):
    _, tok = wl
    big = numbered_docs() * 50  # 5,000 documents
    counting = CountingTokenizer(tok)
    batch = make_batch(counting, big, 4, 32, seed=0)
    assert batch["input_ids"].shape == (4, 32)
    assert counting.n_docs < 300  # needs ~128-256 tokens: only a few chunks of documents are encoded
