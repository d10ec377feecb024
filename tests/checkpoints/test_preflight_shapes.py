"""The hidden-state sample against the model's width, whatever its config.json calls the width, and counted in
the positions the layers see (CANINE's molecules, one per downsampling_rate characters)."""

from __future__ import annotations

import pytest

from anisweep.checkpoints.preflight import PreflightError, check_model_config
from anisweep.extract.model import ExtractSettings


def test_t5s_width_is_read_from_d_model():
    settings = ExtractSettings(n_sequences=4, seq_len=64, sample_tokens=100)
    with pytest.raises(PreflightError, match=r"extract.sample_tokens = 100 keeps fewer .* than d_model = 768"):
        check_model_config({"model_type": "t5", "d_model": 768, "num_layers": 12}, settings, "hub/t5-base/step0")


def test_canines_sample_counts_molecules_not_characters():
    canine = {"model_type": "canine", "hidden_size": 768, "downsampling_rate": 4, "max_position_embeddings": 16384}
    settings = ExtractSettings(n_sequences=4, seq_len=512, sample_tokens=4096)  # 2048 characters, 512 molecules
    with pytest.raises(PreflightError, match=r"n_sequences x seq_len / downsampling_rate 4 = 512 positions"):
        check_model_config(canine, settings, "hub/canine-c/step0")
    check_model_config(canine, ExtractSettings(n_sequences=8, seq_len=512, sample_tokens=4096), "hub/canine-c/step0")


def test_an_image_models_sample_is_checked_against_its_widest_site(tmp_path):
    """A ResNet's last stage is its widest (hidden_sizes[-1]): the sample must hold that many cells per site, before
    any image is processed."""
    import transformers

    from anisweep.checkpoints.preflight import evaluation_batch
    from anisweep.media import MediaCorpus

    transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 48], depths=[1, 1]).save_pretrained(tmp_path)
    corpus = MediaCorpus("image", ("a.png",), (b"not read",))
    with pytest.raises(PreflightError, match=r"sample_tokens = 32 keeps fewer .* widest site \(48\)"):
        evaluation_batch(tmp_path, None, ExtractSettings(n_sequences=1, sample_tokens=32), corpus, "hub/resnet/step0")
