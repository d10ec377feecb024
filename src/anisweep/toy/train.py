"""Train the embedded default sweep: tiny BERT (masked LM) and Pythia-style GPT-NeoX (causal LM).

Both models train on the builtin corpus (:func:`anisweep.corpus.builtin_text`) with a tokenizer
trained on the same text, entirely offline, in under a minute each on 2 CPU cores, and are saved
as Hugging Face checkpoints at the requested optimizer steps (``out_dir/step{N}/``, step 0 = the
initialisation), with ``out_dir/train_log.json`` holding the loss of every step.

Everything is seeded: the same arguments (and the same number of torch threads) give
byte-identical safetensors files. Tokenizer training is made deterministic too (the
``tokenizers`` WordPiece trainer numbers its ``##`` continuation characters in hash-map order;
we hand it the alphabet in sorted order instead).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anisweep import schema
from anisweep.atomic import replacing, write_json
from anisweep.corpus import builtin_text, special_affixes, tokenize_stream
from anisweep.tables import TOKEN_COUNTS
from anisweep.toy.tokenizers import build_tokenizer, check_arch

# Pythia's early grid (0, 1, 2, 4, ..., 512) plus a final step.
DEFAULT_STEPS: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)


_DEFAULTS = schema.defaults("toy")


@dataclass(frozen=True)
class ToySpec:
    """Size and optimisation settings of a toy model (the defaults are the embedded sweep's).

    With the defaults and :data:`DEFAULT_STEPS` (8 sequences of 64 tokens per step) each model trains on
    1 torch thread (more threads do not help models this small and hurt badly when the cores are shared),
    at about half the CPU time per step of 16 sequences (BERT's, with its head on the targets alone:
    0.42 of it), and the loss falls from ln(2048) = 7.6 to about 4.8 (BERT MLM) / 4.0 (GPT-NeoX), the mean
    of the last 50 steps (16 sequences per step: 4.9 / 3.4).
    """

    d_model: int = _DEFAULTS["d_model"]
    n_layers: int = _DEFAULTS["n_layers"]
    n_heads: int = _DEFAULTS["n_heads"]
    d_ff: int = _DEFAULTS["d_ff"]
    seq_len: int = _DEFAULTS["seq_len"]
    batch_size: int = _DEFAULTS["batch_size"]
    lr: float = _DEFAULTS["lr"]
    vocab_size: int = _DEFAULTS["vocab_size"]
    warmup: int = _DEFAULTS["warmup"]
    weight_decay: float = _DEFAULTS["weight_decay"]
    dropout: float = _DEFAULTS["dropout"]
    mlm_probability: float = _DEFAULTS["mlm_probability"]
    grad_clip: float = _DEFAULTS["grad_clip"]
    # Position-embedding table (BERT) / rotary horizon (GPT-NeoX); None = seq_len, so BERT cannot
    # be run on longer sequences than it was trained on.
    max_position_embeddings: int | None = _DEFAULTS["max_position_embeddings"]
    # Analyse the model at its steps while it trains (train_toy's `analyse`) instead of saving checkpoints.
    live: bool = _DEFAULTS["live"]

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def validate(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "batch_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"ToySpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 4:
            raise ValueError(f"ToySpec.seq_len must be >= 4, got {self.seq_len}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"ToySpec.mlm_probability must be in (0, 1), got {self.mlm_probability}")


def build_model(arch: str, spec: ToySpec, tokenizer):
    """A freshly initialised ``BertForMaskedLM`` or Pythia-style ``GPTNeoXForCausalLM``.

    Initialisation draws from torch's global RNG: seed it first.
    """
    check_arch(arch)
    max_pos = spec.max_position_embeddings or spec.seq_len
    shape = {  # the keywords both architectures' configs share
        "vocab_size": len(tokenizer),
        "hidden_size": spec.d_model,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "intermediate_size": spec.d_ff,
        "hidden_act": "gelu",
        "max_position_embeddings": max_pos,
    }
    if arch == "bert":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(
            **shape,
            hidden_dropout_prob=spec.dropout,
            attention_probs_dropout_prob=spec.dropout,
            type_vocab_size=2,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
        )
        return BertForMaskedLM(config)
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eos = tokenizer.eos_token_id
    config = GPTNeoXConfig(
        **shape,
        attention_dropout=spec.dropout,
        hidden_dropout=spec.dropout,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        use_parallel_residual=True,
        tie_word_embeddings=False,
        attention_bias=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return GPTNeoXForCausalLM(config)


class _Batches:
    """Random training windows from a token stream (with replacement across steps), seeded."""

    def __init__(self, arch: str, tokenizer, stream: list[int], spec: ToySpec, generator: torch.Generator):
        self.arch, self.spec, self.gen = arch, spec, generator
        prefix, suffix = special_affixes(tokenizer)
        self.prefix = torch.tensor(prefix, dtype=torch.int64)
        self.suffix = torch.tensor(suffix, dtype=torch.int64)
        self.content_len = spec.seq_len - len(prefix) - len(suffix)
        self.tokens = torch.tensor(stream, dtype=torch.int64)
        if len(self.tokens) <= self.content_len:
            raise ValueError(f"training corpus too short: {len(self.tokens)} tokens, need more than {self.content_len}")
        if arch == "bert":
            special = sorted(set(tokenizer.all_special_ids))
            self.special_ids = torch.tensor(special, dtype=torch.int64)
            keep = torch.ones(len(tokenizer), dtype=torch.bool)
            keep[self.special_ids] = False
            self.replacement_ids = keep.nonzero().squeeze(1)
            self.mask_id = tokenizer.mask_token_id

    def next(self) -> dict[str, torch.Tensor]:
        b, n = self.spec.batch_size, self.content_len
        starts = torch.randint(0, len(self.tokens) - n + 1, (b,), generator=self.gen)
        body = self.tokens[starts[:, None] + torch.arange(n)[None, :]]
        ids = torch.cat([self.prefix.expand(b, -1), body, self.suffix.expand(b, -1)], dim=1)
        if self.arch == "gpt_neox":
            return {"input_ids": ids, "labels": ids.clone()}
        return self._mask(ids)

    def _mask(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """BERT masking: 15% of non-special tokens are targets; of those 80% [MASK], 10% random, 10% kept."""
        g, p = self.gen, self.spec.mlm_probability
        special = torch.isin(ids, self.special_ids)
        target = (torch.rand(ids.shape, generator=g) < p) & ~special
        labels = torch.where(target, ids, torch.full_like(ids, -100))
        r = torch.rand(ids.shape, generator=g)
        to_mask = target & (r < 0.8)
        to_random = target & (r >= 0.8) & (r < 0.9)
        random_ids = self.replacement_ids[torch.randint(0, len(self.replacement_ids), ids.shape, generator=g)]
        inputs = torch.where(to_mask, torch.full_like(ids, self.mask_id), ids)
        inputs = torch.where(to_random, random_ids, inputs)
        return {"input_ids": inputs, "labels": labels}


def training_loss(arch: str, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own LM loss on `batch`. BERT's is computed as BertForMaskedLM computes it (the mean cross-entropy
    over the masked targets), with the prediction head run on the targets alone: the other 85% of the positions
    have no label, and their logits over the vocabulary would cost a third of a training step for nothing."""
    if arch != "bert":
        return model(**batch).loss
    labels = batch["labels"]
    targets = labels != -100
    hidden = model.bert(input_ids=batch["input_ids"]).last_hidden_state
    logits = model.cls(hidden[targets])
    return torch.nn.functional.cross_entropy(logits, labels[targets])


def _save_checkpoint(model, tokenizer, final: Path) -> None:
    """Save model + tokenizer into a temporary sibling folder, then rename it to ``final``."""
    with replacing(final, directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak at the last step (as Pythia)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def write_token_counts(stream, vocab_size: int, path: Path) -> None:
    """The training corpus's count per token id (token_id, count), beside the checkpoints: the gradient analysis's
    frequency strata read it (anisweep.tangent.batch.read_token_counts)."""
    import polars as pl

    from anisweep.tables import write_atomic

    counts = np.bincount(np.asarray(stream, np.int64).ravel(), minlength=vocab_size)
    write_atomic(pl.DataFrame({"token_id": np.arange(len(counts)), "count": counts}), path)


def train_toy(
    arch: str,
    out_dir: str | Path,
    steps: Iterable[int] = DEFAULT_STEPS,
    seed: int = 0,
    spec: ToySpec | None = None,
    *,
    texts: Sequence[str] | None = None,
    num_threads: int | None = None,
    progress: bool = True,
    deterministic: bool = True,
    analyse: Callable[[int, torch.nn.Module, Any], None] | None = None,
    **overrides,
) -> Path:
    """Train a toy ``arch`` ("bert" or "gpt_neox") and save checkpoints at exactly ``steps``.

    Settings come from ``spec`` (default :class:`ToySpec`) with keyword ``overrides`` on top, e.g.
    ``train_toy("bert", out, [0, 10], 0, d_model=32, n_layers=2)``. Each checkpoint (model +
    tokenizer, safetensors) is written atomically to ``out_dir/step{N}/``; ``step0`` is the
    initialisation, ``step{N}`` the model after N optimizer updates. ``out_dir/train_log.json``,
    written last, holds the loss of every step (the loss of the batch of update N, computed before
    that update), its learning rate and tokens seen. ``texts`` defaults to the builtin corpus.
    ``num_threads`` sets torch's intra-op threads for the call (None: leave as is).
    With ``spec.live`` no checkpoint is saved: ``analyse(step, model, tokenizer)`` is called at each of
    ``steps`` instead (e.g. :class:`anisweep.live.toy.LiveAnalysis`); it must leave the model and the RNG
    as it found them (anisweep.live does).
    Returns ``out_dir``.
    """
    check_arch(arch)
    spec = dataclasses.replace(spec or ToySpec(), **overrides)
    spec.validate()
    if spec.live and analyse is None:
        raise ValueError("a live toy (spec.live) needs `analyse`, the analysis to run at its steps")
    save_steps = sorted({int(s) for s in steps})
    if not save_steps or save_steps[0] < 0:
        raise ValueError(f"steps must be a non-empty list of non-negative integers, got {steps!r}")
    total = save_steps[-1]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    torch.use_deterministic_algorithms(deterministic)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            print(f"[toy {arch} seed {seed}] {msg} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)

    try:
        texts = builtin_text() if texts is None else list(texts)
        tokenizer = build_tokenizer(arch, texts, spec.vocab_size)
        tokenizer.model_max_length = spec.max_position_embeddings or spec.seq_len
        stream = tokenize_stream(tokenizer, texts)
        write_token_counts(stream, len(tokenizer), out_dir / TOKEN_COUNTS)
        say(f"tokenizer: {len(tokenizer)} tokens; corpus: {len(stream)} tokens; {total} steps")

        torch.manual_seed(seed)
        model = build_model(arch, spec, tokenizer)
        model.train()
        batches = _Batches(arch, tokenizer, stream, spec, torch.Generator().manual_seed(seed))

        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=spec.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            fused=True,  # one kernel: a toy's ~60 small tensors cost more to loop over than to update
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, spec.warmup, total))

        log: list[dict] = []
        save_set = set(save_steps)

        def keep(step: int) -> None:
            if spec.live:
                analyse(step, model, tokenizer)
            else:
                _save_checkpoint(model, tokenizer, out_dir / f"step{step}")

        if 0 in save_set:
            keep(0)
            say("analysed step0" if spec.live else "saved step0")
        every = max(1, total // 20)
        for step in range(1, total + 1):
            batch = batches.next()
            loss = training_loss(arch, model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip, foreach=True)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"toy {arch} loss is {value} at step {step}; lower lr")
            log.append({"step": step, "loss": value, "lr": lr, "tokens_seen": step * spec.tokens_per_step})
            if step in save_set:
                keep(step)
            if step % every == 0 or step == total or step in save_set:
                done = " analysed" if spec.live else " saved"
                say(f"step {step}/{total} loss {value:.4f}" + (done if step in save_set else ""))

        wall = time.perf_counter() - t0
        write_json(
            {
                "arch": arch,
                "seed": seed,
                "spec": dataclasses.asdict(spec),
                "vocab_size": len(tokenizer),
                "corpus_tokens": len(stream),
                "tokens_per_step": spec.tokens_per_step,
                "checkpoint_steps": save_steps,
                "total_steps": total,
                "num_threads": torch.get_num_threads(),
                "wall_time_s": round(wall, 3),
                "loss_start": log[0]["loss"] if log else None,
                "loss_end": log[-1]["loss"] if log else None,
                "log": log,
            },
            out_dir / "train_log.json",
            indent=1,
        )
        say(f"done: {len(save_steps)} {'steps analysed' if spec.live else 'checkpoints'} in {out_dir}")
        return out_dir
    finally:
        torch.use_deterministic_algorithms(prev_det)
        if num_threads is not None:
            torch.set_num_threads(prev_threads)
