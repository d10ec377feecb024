"""The masked pass of an encoder (anisweep.extract.masked): which tokens it masks, and that a decoder or a
tokenizer without a mask token gets none. Its states against Hugging Face's: tests/weights/test_logit_lens.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM, GPTNeoXForCausalLM

from anisweep.extract.masked import MASK_SHARE, masked_positions

from conftest import bert_config, neox_config, padded_batch, run_extract, saved


def test_masked_positions_are_a_seeded_share_of_each_sequences_text_tokens():
    ids = torch.tensor([[1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 2], [1, 7, 8, 9, 2, 0, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    seq, position = masked_positions(ids, mask, special_ids=(0, 1, 2), seed=3)
    first, second = position[seq == 0], position[seq == 1]
    assert len(first) == round(MASK_SHARE * 10) and len(second) == 1  # at least one per sequence
    assert set(first) <= set(range(1, 11)) and set(second) <= {1, 2, 3}  # text tokens only
    assert list(first) == sorted(first)
    again = masked_positions(ids, mask, special_ids=(0, 1, 2), seed=3)
    assert np.array_equal(again[0], seq) and np.array_equal(again[1], position)
    other = masked_positions(ids, mask, special_ids=(0, 1, 2), seed=4)
    assert not np.array_equal(other[1], position)


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_only_an_encoder_with_a_mask_token_has_masked_states(tmp_path):
    batch = padded_batch() | {"mask_token_id": 4, "special_ids": (0, 4)}
    encoder, _ = run_extract(saved(tmp_path, BertForMaskedLM, bert_config(), "bert"), batch)
    decoder, _ = run_extract(saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "neox"), batch)
    unmaskable, _ = run_extract(tmp_path / "bert", padded_batch())
    masked = encoder["masked_resid"]
    assert masked.height > 0 and sorted(masked["layer"].unique()) == list(range(bert_config().num_hidden_layers + 1))
    assert decoder["masked_resid"].height == 0 and unmaskable["masked_resid"].height == 0
