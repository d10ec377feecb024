"""A toy model analysed while it trains (`toy.<name>.live`): at each of its steps, extract's tables and the
gradient tables of the model in memory (anisweep.live) instead of a saved checkpoint.

`train-toy` with a live spec writes every step into `results/toy/{model}/live/step{N}/`; the workflow's
`extract_live` rule then `take`s (anisweep.live.take) step N's files into `results/toy/{model}/step{N}/`, where
extract puts a saved checkpoint's, so the gradient shares, metrics, sweep and figures
run on them unchanged. The evaluation batch is the one extract builds for the saved checkpoint: the same texts and
settings, tokenized by the toy's tokenizer as it is read back from disk, so the numbers equal a saved-checkpoint
run's.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from anisweep.extract.model import DTYPES, ExtractSettings
from anisweep.live.callback import analyse_live
from anisweep.live.take import live_ident
from anisweep.tangent.batch import read_token_counts
from anisweep.tangent.settings import GradientSettings


class LiveAnalysis:
    """train_toy's `analyse`: step N of toy `name` into `out_dir/step{N}/`. The gradient tables at the steps
    `gradients.steps` names (all when None), when `gradients.enabled`."""

    def __init__(
        self,
        name: str,
        seed: int,
        tokens_per_step: int,
        texts: Sequence[str],
        settings: ExtractSettings,
        gradients: GradientSettings,
        out_dir: str | Path,
    ):
        self.name, self.seed, self.tokens_per_step = name, seed, tokens_per_step
        self.texts, self.settings, self.gradients = list(texts), settings, gradients
        self.out_dir = Path(out_dir)
        self.batch = self.tokenizer = None

    def _prepare(self, tokenizer) -> None:
        """The tokenizer as extract reads it from a saved checkpoint, and the evaluation batch it makes."""
        from anisweep.checkpoints.preflight import PreflightError, check_unknown_tokens, load_tokenizer
        from anisweep.corpus import make_batch

        where = f"toy/{self.name}"
        with tempfile.TemporaryDirectory(prefix="anisweep-toy-tokenizer-") as folder:
            tokenizer.save_pretrained(folder)
            self.tokenizer = load_tokenizer(folder, folder, where)
        s = self.settings
        try:
            self.batch = make_batch(self.tokenizer, self.texts, s.n_sequences, s.seq_len, s.seed)
        except ValueError as error:
            raise PreflightError(f"{where}: {error} (the config's corpus and extract sections)") from None
        limit = s.max_unknown_token_share
        check_unknown_tokens(self.tokenizer, self.batch, self.texts, limit, "the toy's tokenizer", where)

    def __call__(self, step: int, model: torch.nn.Module, tokenizer) -> None:
        if self.batch is None:
            self._prepare(tokenizer)
        g = self.gradients
        gradients = g if g.enabled and (g.steps is None or step in g.steps) else GradientSettings(enabled=False)
        target = model
        if self.settings.dtype != "float32":  # as extract loads the checkpoint: cast, on a copy
            target = copy.deepcopy(model).to(DTYPES[self.settings.dtype])
        ident = live_ident(self.name, step, self.tokens_per_step, self.seed, family="toy")
        out = self.out_dir / f"step{step}"
        counts = read_token_counts(self.out_dir)  # train_toy's, of the toy's training corpus
        analyse_live(target, self.batch, self.tokenizer, out, ident, self.settings, gradients, counts)
