"""config/godey2024_modalities_{vision,speech}.yaml (Godey et al. 2024, Section 3.2) as written: each parses, and
plans the whole workflow (`snakemake -n`) offline, every model's repository laid out in a Hugging Face cache under
its real id (tests/hubcache.py) with the config.json of its architecture (the plan reads it: an architecture no
adapter knows would stop it). The datasets are read only when the corpus job runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import transformers
import yaml

from anisweep.config import complete
from anisweep.media import modality_of

from conftest import snakemake_command
from hubcache import build_hub_cache

pytestmark = pytest.mark.slow  # two dry runs of the whole workflow

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"vision": "godey2024_modalities_vision.yaml", "speech": "godey2024_modalities_speech.yaml"}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
ARCHITECTURES = {  # model_type: the config class and its tiny dimensions
    "vit": (transformers.ViTConfig, TINY),
    "beit": (transformers.BeitConfig, TINY),
    "deit": (transformers.DeiTConfig, TINY),
    "segformer": (transformers.SegformerConfig, {}),
    "resnet": (transformers.ResNetConfig, dict(hidden_sizes=[8, 16], depths=[1, 1])),
    "efficientnet": (transformers.EfficientNetConfig, {}),
    "cvt": (transformers.CvtConfig, {}),
    "convnext": (transformers.ConvNextConfig, dict(hidden_sizes=[8, 16], depths=[1, 1])),
    "wav2vec2": (transformers.Wav2Vec2Config, TINY),
    "hubert": (transformers.HubertConfig, TINY),
    "whisper": (transformers.WhisperConfig, dict(d_model=32, encoder_layers=2, decoder_layers=1)),
}
MODEL_TYPES = {  # the architecture behind each repository the configs name (commented-out entries included)
    "google/vit-base-patch16-224": "vit",
    "microsoft/beit-base-patch16-224": "beit",
    "nvidia/mit-b0": "segformer",
    "facebook/deit-base-patch16-224": "deit",
    "microsoft/resnet-50": "resnet",
    "google/efficientnet-b0": "efficientnet",
    "microsoft/cvt-13": "cvt",
    "facebook/convnext-base-224": "convnext",
    "facebook/wav2vec2-base": "wav2vec2",
    "facebook/hubert-base-ls960": "hubert",
    "openai/whisper-base": "whisper",
}


def config_of(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / CONFIGS[name]).read_text())


def repository(model_type: str) -> dict[str, bytes]:
    """The files a dry run reads of a repository: its config.json (and the processor's, and a stand-in for the
    weights, which a dry run lists but never reads)."""
    cls, dims = ARCHITECTURES[model_type]
    config = cls(**dims).to_dict()
    processor = {"feature_extractor_type": "Wav2Vec2FeatureExtractor", "sampling_rate": 16000}
    if model_type not in ("wav2vec2", "hubert", "whisper"):
        processor = {"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32}}
    return {
        "config.json": json.dumps(config).encode(),
        "preprocessor_config.json": json.dumps(processor).encode(),
        "model.safetensors": b"not read by a dry run",
    }


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hf_home = tmp_path_factory.mktemp("modalities") / "hf"
    for repo, model_type in MODEL_TYPES.items():
        build_hub_cache(hf_home, repo, {"main": repository(model_type)})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    return env | {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_the_configs_name_the_papers_models_under_their_repository_ids():
    named = {entry["repo"]: entry["group"] for name in CONFIGS for entry in config_of(name)["models"]}
    assert set(named) <= set(MODEL_TYPES)
    assert set(named.values()) == {"vision transformers", "convolutional", "speech"}
    for name, modality in (("vision", "image"), ("speech", "audio")):
        assert modality_of(complete(config_of(name))["corpus"]) == modality
    assert len(named) == 11  # every model of Section 3.2 but VAN, which the config says is gone from transformers
    text = (ROOT / "config" / CONFIGS["vision"]).read_text()
    assert "VAN" in text and "no longer in transformers" in text


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_section_3_2_config_dry_runs_offline_on_the_real_repository_ids(hub, tmp_path, name):
    configfile = ROOT / "config" / CONFIGS[name]
    command = snakemake_command(tmp_path, "--configfile", str(configfile), "--cores", "2", "-n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=hub)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plot_survey" in done.stdout and "corpus" in done.stdout
    for entry in config_of(name)["models"]:
        assert f"results/hub/{entry['name']}/step0" in done.stdout, entry["name"]


@pytest.mark.parametrize(
    "repo, corpus, says",
    [
        ("google/vit-base-patch16-224", {"source": "builtin"}, r"corpus holds text but the model \(vit\) reads image"),
        ("facebook/wav2vec2-base", {"source": "images", "paths": ["imgs"]}, "corpus holds image but the model"),
    ],
    ids=["text-for-an-image-model", "images-for-a-speech-model"],
)
def test_a_cached_model_of_another_modality_stops_the_plan(hub, tmp_path, repo, corpus, says):
    """Before any job: the corpus step would download a dataset before fetch's check of the model's config.json."""
    configfile = tmp_path / "mismatch.yaml"
    models = [{"family": "hub", "name": repo, "steps": "final"}]
    configfile.write_text(yaml.safe_dump({"models": models, "corpus": corpus}))
    command = snakemake_command(tmp_path / "work", "--configfile", str(configfile), "--cores", "2", "-n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=hub)
    text = done.stdout + done.stderr
    assert done.returncode != 0
    assert re.search(f"config: hub/{repo.replace('/', '--')}/step0: the {says}", text), text[-3000:]
    assert "set the config's corpus.source to" in text and "corpus.parquet" not in text  # no job planned
