"""A folder of the user's own images, and one of their own recordings, swept end to end by the whole workflow,
offline: a tiny random ViT under `google/vit-base-patch16-224` and a tiny random wav2vec 2.0 under
`facebook/wav2vec2-base` in a Hugging Face cache (tests/hubcache.py), each with the processor its repository ships
(`preprocessor_config.json`), and `corpus: {source: images | audio, paths: [DIR]}` as docs/modalities.md writes it.
The images: matplotlib's sample photograph and PNGs of other sizes made here; the recordings: WAVs of unequal
length written here, one at 8 kHz (`corpus.resample`)."""

from __future__ import annotations

import io
import json
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

from conftest import job_stats, snakemake_command
from hubcache import build_hub_cache, offline_env

# two whole workflows; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

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


#: Section 3.2's other image architectures, tiny, under the vision config's ids: hierarchical transformers with keys
#: shorter than queries and stages of their own widths, and a convolutional network with no attention at all
SURVEY = {
    "nvidia/mit-b0": (
        transformers.SegformerForImageClassification,
        dict(
            depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 2, 3, 4], sr_ratios=[4, 2, 1, 1]
        ),
    ),
    "microsoft/cvt-13": (
        transformers.CvtForImageClassification,
        dict(embed_dim=[8, 12, 16], num_heads=[1, 2, 4], depth=[1, 2, 3]),
    ),
    "microsoft/resnet-50": (
        transformers.ResNetForImageClassification,
        dict(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1]),
    ),
}


def tiny_image_model(folder: Path, cls, config: dict) -> Path:
    """The model on 32 x 32 images, its processor resizing to them."""
    cls(cls.config_class(**config)).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    hf_home = root / "hf"
    build_hub_cache(hf_home, VIT, {"main": tiny_vit(root / "models" / "vit")})
    build_hub_cache(hf_home, WAV2VEC2, {"main": tiny_wav2vec2(root / "models" / "wav2vec2")})
    for repo, (cls, config) in SURVEY.items():
        build_hub_cache(hf_home, repo, {"main": tiny_image_model(root / "models" / repo, cls, config)})
    env = offline_env(hf_home)
    return {"root": root, "env": env}


def write_config(world, name: str, repo: str, corpus: dict) -> Path:
    config = {
        "models": [{"family": "hub", "name": repo, "steps": "final"}],
        "corpus": corpus,
        "extract": EXTRACT,
        "resources": {"extract_threads": 1},
    }
    configfile = world["root"] / f"{name}.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    return configfile


def snakemake(world, workdir: Path, configfile: Path, *args: str) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=1200, env=world["env"])


def sweep(world, name: str, repo: str, corpus: dict) -> dict:
    configfile = write_config(world, name, repo, corpus)
    workdir = world["root"] / name
    folder = f"results/hub/{repo.replace('/', '--')}"
    targets = (f"{folder}/sweep.parquet", f"{folder}/figures/isotropy.png")  # what the tests read
    done = snakemake(world, workdir, configfile, *targets)
    assert done.returncode == 0, done.stderr[-6000:]
    return {
        "name": name,
        "repo": repo,
        "corpus": corpus,
        "workdir": workdir,
        "results": workdir / folder,
        "targets": targets,
    }


def planned(world, run: dict, **corpus) -> dict[str, int]:
    """The jobs a dry run schedules (Snakemake's `Job stats`, without `all`) after the corpus keys change."""
    configfile = write_config(world, f"{run['name']}-changed", run["repo"], {**run["corpus"], **corpus})
    done = snakemake(world, run["workdir"], configfile, "-n", *run["targets"])
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


@pytest.fixture(scope="module")
def images(world):
    folder = my_images(world["root"] / "my_images")
    return sweep(world, "images", VIT, {"source": "images", "paths": [str(folder)]})


@pytest.fixture(scope="module")
def recordings(world):
    folder = my_recordings(world["root"] / "my_recordings")
    corpus = {"source": "audio", "paths": [str(folder)], "resample": True, "max_seconds": 0.25}
    return sweep(world, "audio", WAV2VEC2, corpus)


def check_layers(results: Path, n_layers: int) -> pl.DataFrame:
    sweep = pl.read_parquet(results / "sweep.parquet")
    resid = sweep.filter((pl.col("site") == "resid") & (pl.col("metric") == "avg_cos_pairs")).sort("layer")
    assert resid["layer"].to_list() == list(range(n_layers + 1))
    assert resid["value"].is_finite().all()
    attention = pl.read_parquet(results / "step0" / "attention.parquet")
    assert attention.height == n_layers * 4 and attention["entropy_mean"].is_finite().all()
    assert (results / "figures" / "isotropy.png").stat().st_size > 10_000
    return sweep


def test_a_folder_of_my_images_sweeps_a_vit(images):
    results = images["results"]
    check_layers(results, 2)
    info = json.loads((results / "step0" / "extract.json").read_text())
    assert info["n_valid_tokens"] == EXTRACT["n_sequences"] * (1 + 16)  # [CLS] and 16 patches an image
    assert info["checkpoint"]["repo_id"] == VIT


def test_a_folder_of_my_recordings_sweeps_wav2vec2(recordings):
    results = recordings["results"]
    check_layers(results, 2)
    info = json.loads((results / "step0" / "extract.json").read_text())
    # frames of each clip as cut (0.25 s at most) and resampled to 16 kHz: (samples - 10) // 5 + 1, then
    # (that - 4) // 4 + 1, none of the padding
    media = pl.read_parquet(recordings["workdir"] / "resources" / "corpus.parquet")
    frames = 0
    for blob in media["data"].to_list()[: EXTRACT["n_sequences"]]:
        samples, rate = soundfile.read(io.BytesIO(blob))
        n = min(round(len(samples) * 16_000 / rate), 4_000)
        frames += ((n - 10) // 5 + 1 - 4) // 4 + 1
    assert info["n_valid_tokens"] == frames


# docs/reruns.md, the `corpus:` rows of images and audio: every key a corpus reads changes resources/corpus.parquet
# (the chosen files' bytes, their order, the audio options), so the corpus, fetch and extract rerun, then what reads
# them; a key it does not read reruns nothing.
MODEL_RUN = {"corpus": 1, "fetch": 1, "extract": 1}


def test_nothing_reruns_unchanged_nor_for_a_key_images_do_not_read(world, images):
    unchanged = planned(world, images)  # {}, unless the package's analysis sources were edited since the run
    assert not set(MODEL_RUN) & set(unchanged)
    assert planned(world, images, max_seconds=3.0, resample=True) == unchanged


@pytest.mark.parametrize("change", [{"max_items": 7}, {"seed": 1}, {"paths": "two folders"}], ids=str)
def test_an_image_corpus_key_reruns_the_corpus_and_the_model_runs(world, images, change):
    if change.get("paths") == "two folders":
        extra = world["root"] / "more_images"
        extra.mkdir(exist_ok=True)
        Image.new("RGB", (30, 20), "teal").save(extra / "teal.png")
        change = {"paths": [*images["corpus"]["paths"], str(extra)]}
    jobs = planned(world, images, **change)
    assert {name: jobs.get(name) for name in MODEL_RUN} == MODEL_RUN
    assert {"metrics", "sweep"} <= set(jobs)


@pytest.mark.parametrize("change", [{"max_seconds": 0.2}, {"resample": False}], ids=str)
def test_an_audio_corpus_key_reruns_the_corpus_and_the_model_runs(world, recordings, change):
    jobs = planned(world, recordings, **change)
    assert {name: jobs.get(name) for name in MODEL_RUN} == MODEL_RUN


def test_hierarchical_and_convolutional_models_sweep_my_images_into_the_survey_figures(world):
    """MiT, CvT and ResNet through the whole workflow in one run, grouped as the Section 3.2 vision config groups
    them: every layer's anisotropy, the attention tables where there is attention (none for ResNet), and the survey
    figures drawn across them."""
    folder = world["root"] / "survey_images"
    if not folder.exists():
        my_images(folder)
    models = [
        {"family": "hub", "group": "vision transformers", "name": "nvidia/mit-b0", "steps": "final"},
        {"family": "hub", "group": "convolutional", "name": "microsoft/cvt-13", "steps": "final"},
        {"family": "hub", "group": "convolutional", "name": "microsoft/resnet-50", "steps": "final"},
    ]
    config = {
        "models": models,
        "corpus": {"source": "images", "paths": [str(folder)]},
        "extract": EXTRACT,
        "untrained": {"enabled": False},
        "resources": {"extract_threads": 1},
    }
    configfile = world["root"] / "survey.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = world["root"] / "survey"
    figures = ("survey_layers", "survey_drift_p")
    targets = [f"results/hub/{entry['name'].replace('/', '--')}/sweep.parquet" for entry in models]
    done = snakemake(world, workdir, configfile, *targets, *(f"results/figures/{name}.png" for name in figures))
    assert done.returncode == 0, done.stderr[-6000:]
    layers = {"nvidia/mit-b0": 4, "microsoft/cvt-13": 6, "microsoft/resnet-50": 4}
    for repo, n_layers in layers.items():
        results = workdir / "results" / "hub" / repo.replace("/", "--")
        sweep = pl.read_parquet(results / "sweep.parquet")
        resid = sweep.filter((pl.col("site") == "resid") & (pl.col("metric") == "avg_cos")).sort("layer")
        assert resid["layer"].to_list() == list(range(n_layers + 1)), repo
        assert resid["value"].is_finite().all(), repo
        attention = pl.read_parquet(results / "step0" / "attention.parquet")
        assert attention.is_empty() == (repo == "microsoft/resnet-50")
    for figure in figures:
        assert (workdir / "results" / "figures" / f"{figure}.png").stat().st_size > 10_000
