"""A folder of the user's own images, and one of their own recordings, swept end to end by the whole workflow,
offline: a tiny random ViT under `google/vit-base-patch16-224` and a tiny random wav2vec 2.0 under
`facebook/wav2vec2-base` in a Hugging Face cache (tests/hubcache.py), each with the processor its repository ships
(`preprocessor_config.json`), and `corpus: {source: images | audio, paths: [DIR]}` as docs/modalities.md writes it.
The images: matplotlib's sample photograph and PNGs of other sizes made here; the recordings: WAVs of unequal
length written here, one at 8 kHz (`corpus.resample`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import pytest
import soundfile
import transformers
import yaml
from PIL import Image

from conftest import snakemake_command
from hubcache import build_hub_cache

pytestmark = pytest.mark.slow  # two whole workflows

VIT, WAV2VEC2 = "google/vit-base-patch16-224", "facebook/wav2vec2-base"
EXTRACT = {"n_sequences": 6, "batch_size": 3, "sample_tokens": 64, "qk_sample_tokens": 64, "device": "cpu"}


def tiny_vit(folder: Path) -> Path:
    """2 layers on 16 x 16 images in patches of 4 (16 patches and [CLS]); the processor resizes to 16 x 16."""
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
    )
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


def tiny_wav2vec2(folder: Path) -> Path:
    """2 layers over a conv stack of stride 20 (800 frames a second at 16 kHz)."""
    config = transformers.Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        conv_dim=(16, 16),
        conv_kernel=(10, 4),
        conv_stride=(5, 4),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
    )
    transformers.Wav2Vec2ForPreTraining(config).save_pretrained(folder)
    transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000, return_attention_mask=True).save_pretrained(folder)
    return folder


def my_images(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "grace_hopper.jpg").write_bytes(
        (Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").read_bytes()
    )
    rng = np.random.default_rng(0)
    for i in range(7):
        Image.fromarray(rng.integers(0, 255, (20 + 9 * i, 31, 3), dtype=np.uint8)).save(folder / f"photo{i}.png")
    return folder


def my_recordings(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, (seconds, rate) in enumerate([(0.1, 16_000), (0.2, 16_000), (0.3, 8_000), (0.15, 16_000)] * 2):
        t = np.arange(int(seconds * rate)) / rate
        tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * i) * t) + 0.05 * rng.standard_normal(t.size)
        soundfile.write(folder / f"take{i}.wav", tone.astype(np.float32), rate)
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    hf_home = root / "hf"
    build_hub_cache(hf_home, VIT, {"main": tiny_vit(root / "models" / "vit")})
    build_hub_cache(hf_home, WAV2VEC2, {"main": tiny_wav2vec2(root / "models" / "wav2vec2")})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return {"root": root, "env": env}


def sweep(world, name: str, repo: str, corpus: dict) -> Path:
    config = {
        "models": [{"family": "hub", "name": repo, "steps": "final"}],
        "corpus": corpus,
        "extract": EXTRACT,
        "resources": {"extract_threads": 1},
    }
    configfile = world["root"] / f"{name}.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = world["root"] / name
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2")
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=world["env"])
    assert done.returncode == 0, done.stderr[-6000:]
    return workdir / "results" / "hub" / repo.replace("/", "--")


def check_layers(results: Path, n_layers: int) -> pl.DataFrame:
    sweep = pl.read_parquet(results / "sweep.parquet")
    resid = sweep.filter((pl.col("site") == "resid") & (pl.col("metric") == "avg_cos_pairs")).sort("layer")
    assert resid["layer"].to_list() == list(range(n_layers + 1))
    assert resid["value"].is_finite().all()
    attention = pl.read_parquet(results / "step0" / "attention.parquet")
    assert attention.height == n_layers * 4 and attention["entropy_mean"].is_finite().all()
    assert (results / "figures" / "isotropy.png").stat().st_size > 10_000
    return sweep


def test_a_folder_of_my_images_sweeps_a_vit(world):
    folder = my_images(world["root"] / "my_images")
    results = sweep(world, "images", VIT, {"source": "images", "paths": [str(folder)]})
    check_layers(results, 2)
    info = json.loads((results / "step0" / "extract.json").read_text())
    assert info["n_valid_tokens"] == EXTRACT["n_sequences"] * (1 + 16)  # [CLS] and 16 patches an image
    assert info["checkpoint"]["repo_id"] == VIT


def test_a_folder_of_my_recordings_sweeps_wav2vec2(world):
    folder = my_recordings(world["root"] / "my_recordings")
    corpus = {"source": "audio", "paths": [str(folder)], "resample": True, "max_seconds": 0.25}
    results = sweep(world, "audio", WAV2VEC2, corpus)
    check_layers(results, 2)
    info = json.loads((results / "step0" / "extract.json").read_text())
    # frames of each clip as cut (0.25 s at most) and resampled to 16 kHz: (samples - 10) // 5 + 1, then
    # (that - 4) // 4 + 1, none of the padding
    media = pl.read_parquet(results.parents[2] / "resources" / "corpus.parquet")
    frames = 0
    for blob in media["data"].to_list()[: EXTRACT["n_sequences"]]:
        samples, rate = soundfile.read(io.BytesIO(blob))
        n = min(round(len(samples) * 16_000 / rate), 4_000)
        frames += ((n - 10) // 5 + 1 - 4) // 4 + 1
    assert info["n_valid_tokens"] == frames
