"""The toys' tokenizers, trained on the builtin corpus: WordPiece for BERT, byte-level BPE for GPT-NeoX."""

from __future__ import annotations

import json
from collections.abc import Sequence

ARCHS = ("bert", "gpt_neox")
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


NEOX_EOS = "<|endoftext|>"


def check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown toy arch {arch!r}; expected one of {', '.join(ARCHS)}")


def build_bert_tokenizer(texts: Sequence[str], vocab_size: int):
    """A lower-cased WordPiece tokenizer trained on ``texts``, as a transformers ``BertTokenizer``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    initial: set[str] = set()
    continuing: set[str] = set()
    for text in texts:
        for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(text)):
            initial.add(word[0])
            continuing.update(word[1:])
    # Passing every character (and its "##" form) in sorted order makes training deterministic:
    # otherwise the trainer numbers the "##x" tokens in hash-map order, which breaks merge ties
    # differently in every process.
    specials = list(BERT_SPECIAL_TOKENS) + ["##" + c for c in sorted(continuing)]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=sorted(initial | continuing),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    vocab = tok.get_vocab()  # token -> id; the 5 BERT specials are ids 0-4
    return BertTokenizer(vocab=vocab, do_lower_case=True)


def build_neox_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts``, as a transformers ``GPTNeoXTokenizer``.

    ``<|endoftext|>`` (id 0) is bos, eos, unk and pad, as commonly used with Pythia.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GPTNeoXTokenizer

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[NEOX_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return GPTNeoXTokenizer(
        vocab=model["vocab"],
        merges=merges,
        unk_token=NEOX_EOS,
        bos_token=NEOX_EOS,
        eos_token=NEOX_EOS,
        pad_token=NEOX_EOS,
    )


def build_tokenizer(arch: str, texts: Sequence[str], vocab_size: int):
    check_arch(arch)
    return build_bert_tokenizer(texts, vocab_size) if arch == "bert" else build_neox_tokenizer(texts, vocab_size)
