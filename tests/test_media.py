"""Images and audio as the corpus (anisweep.media), and bad input stopping before any download with an error that
says what to do: a folder of images for a text model and the reverse, a file that does not decode, a sample rate the
feature extractor refuses, a dataset column that does not exist, a gated dataset without a token, an empty folder,
fewer items than the evaluation batch needs. The images are made here (PIL) or matplotlib's sample image; the
WAVs are written here with soundfile."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import soundfile
import transformers
from PIL import Image

from anisweep import cli
from anisweep.checkpoints.fetch import FetchError, fetch
from anisweep.checkpoints.preflight import PreflightError, evaluation_batch
from anisweep.config import checkpoints, complete
from anisweep.corpus import load_texts, read_corpus
from anisweep.errors import ConfigError
from anisweep.extract.model import ExtractSettings
from anisweep.media import (
    MediaCorpus,
    MediaError,
    corpus_settings,
    load_dataset_or_explain,
    load_media,
    make_media_batch,
    write_media,
)

from hubcache import build_hub_cache, offline_hub, save_tiny_bert

GRACE_HOPPER = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
VIT = "google/vit-base-patch16-224"
BERT = "google-bert/bert-base-uncased"


def png(path: Path, seed: int, size=(20, 24)) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)
    return path


def image_folder(folder: Path, n: int = 6) -> Path:
    for i in range(n):
        png(folder / f"img{i}.png", i, size=(16 + 3 * i, 24))
    return folder


def wav(path: Path, seconds: float, rate: int = 16_000, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * rate)).astype(np.float32)
    soundfile.write(path, samples, rate)
    return path


def settings(n_sequences: int = 4) -> ExtractSettings:
    return ExtractSettings(n_sequences=n_sequences, seq_len=16, batch_size=2, sample_tokens=32, device="cpu")


def tiny_vit(folder: Path) -> Path:
    """A random 2-layer ViT on 16 x 16 images in patches of 4, with the processor its repository ships."""
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
    )
    transformers.ViTModel(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


def without_weights(folder: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """A saved model's files as (the files a cache holds, the weights it lists but holds not): an offline fetch
    that asks for the weights fails, so a test that gets the preflight's error proves none were asked for."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    weights = {name: files.pop(name) for name in list(files) if name.endswith((".safetensors", ".bin"))}
    return files, weights


def hub_checkpoint(repo: str):
    (ckpt,) = checkpoints(complete({"models": [{"family": "hub", "name": repo, "steps": "final"}]}))
    return ckpt


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An offline cache with a tiny ViT and a tiny BERT under their real ids, their weights listed, not held."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    for repo, folder in ((VIT, tiny_vit(tmp_path / "vit")), (BERT, save_tiny_bert(tmp_path / "bert"))):
        files, weights = without_weights(folder)
        build_hub_cache(hf_home, repo, {"main": files}, remote_only=weights)
    return hf_home


def corpus_file(tmp_path: Path, corpus: dict) -> Path:
    out = tmp_path / "corpus.parquet"
    assert cli.main(["corpus", "--corpus", json.dumps(corpus), "--out", str(out)]) == 0
    return out


def fetch_checked(repo: str, texts: Path, dest: Path, n_sequences: int = 4) -> None:
    """fetch as the rule runs it: the preflight against the corpus file before any weight moves."""
    corpus, extract = read_corpus(texts), settings(n_sequences)
    ckpt = hub_checkpoint(repo)
    fetch(ckpt, dest, retries=0, before_weights=lambda f, t: evaluation_batch(f, t, extract, corpus, ckpt.key))


# ------------------------------------------------------------------------------------------------ the corpus


def test_a_folder_of_images_is_chosen_seeded_and_stored_as_its_bytes(tmp_path):
    folder = image_folder(tmp_path / "imgs", 6)
    (folder / "notes.txt").write_text("not an image")
    (folder / "sub").mkdir()
    png(folder / "sub" / "deep.jpg", 9)
    corpus = {"source": "images", "paths": [str(folder)], "max_items": 5, "seed": 3}
    out = corpus_file(tmp_path, corpus)
    media = read_corpus(out)
    assert isinstance(media, MediaCorpus) and media.modality == "image" and len(media) == 5
    assert all(Path(name).suffix in (".png", ".jpg") for name in media.names)  # subfolders searched, .txt not
    assert media.data[0] == Path(media.names[0]).read_bytes()
    assert load_media(corpus).names == media.names  # the same seed, the same choice and order
    assert load_media({**corpus, "seed": 4}).names != media.names


def test_the_batch_is_the_processors_pixel_values_of_the_first_items(tmp_path):
    media = load_media({"source": "images", "paths": [str(image_folder(tmp_path / "imgs")), str(GRACE_HOPPER)]})
    processor = transformers.ViTImageProcessor(size={"height": 16, "width": 16})
    batch = make_media_batch(processor, media, 4)
    assert tuple(batch["pixel_values"].shape) == (4, 3, 16, 16)


def test_audio_is_cut_to_max_seconds_and_padded_with_a_mask(tmp_path):
    for i, seconds in enumerate((0.5, 1.0, 3.0)):
        wav(tmp_path / "clips" / f"c{i}.wav", seconds, seed=i)
    media = load_media({"source": "audio", "paths": [str(tmp_path / "clips")], "max_seconds": 2.0})
    extractor = transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000, return_attention_mask=True)
    batch = make_media_batch(extractor, media, 3)
    assert tuple(batch["input_values"].shape) == (3, 32_000)  # the longest clip, cut to 2 s
    assert sorted(batch["attention_mask"].sum(1).tolist()) == [8_000, 16_000, 32_000]


def test_the_corpus_rule_records_only_the_keys_its_corpus_reads():
    text = complete({"models": [{"family": "hub", "name": VIT, "steps": "final"}]})["corpus"]
    assert corpus_settings(text) == {"source": "builtin"}  # the image and audio keys' defaults rerun nothing
    models = [{"family": "hub", "name": VIT, "steps": "final"}]
    images = complete({"models": models, "corpus": {"source": "images", "paths": ["imgs"]}})["corpus"]
    assert set(corpus_settings(images)) == {"source", "paths", "modality", "max_items", "seed"}
    audio = {"source": "audio", "paths": ["a"], "resample": True, "max_seconds": 5.0, "max_items": 8, "seed": 1}
    assert corpus_settings(audio) == audio
    assert "resample" not in corpus_settings({**audio, "source": "images"})


# ------------------------------------------------------------------------------------------------ the config


@pytest.mark.parametrize(
    "models, extra",
    [
        (
            [{"family": "toy", "name": "toy-bert", "steps": "all"}],
            {"toy": {"toy-bert": {"arch": "bert", "steps": [0, 4]}}},
        ),
        ([{"family": "local", "name": "mine", "path": "run", "steps": "all", "live": True}], {}),
    ],
    ids=["toy", "live"],
)
def test_a_toy_or_live_model_on_images_is_a_config_error(models, extra):
    with pytest.raises(ConfigError, match=r"read text .* config of their own with a text corpus"):
        complete({"models": models, "corpus": {"source": "images", "paths": ["imgs"]}, **extra})


def test_the_gradient_analysis_on_audio_is_a_config_error():
    config = {"models": [{"family": "hub", "name": VIT, "steps": "final"}], "gradients": {"enabled": True}}
    with pytest.raises(ConfigError, match="gradients.enabled: false"):
        complete({**config, "corpus": {"source": "audio", "paths": ["clips"]}})


def test_fewer_items_kept_than_the_evaluation_batch_is_a_config_error():
    config = {"models": [{"family": "hub", "name": VIT, "steps": "final"}], "extract": {"n_sequences": 16}}
    with pytest.raises(ConfigError, match=r"corpus.max_items = 8 is below extract.n_sequences = 16: .* raise"):
        complete({**config, "corpus": {"source": "images", "paths": ["imgs"], "max_items": 8}})


def test_an_image_corpus_without_paths_is_a_config_error():
    with pytest.raises(ConfigError, match=r"corpus.paths lists no folder"):
        complete({"models": [{"family": "hub", "name": VIT, "steps": "final"}], "corpus": {"source": "images"}})


# ------------------------------------------------------------------------------------------------ fetch


def test_fetch_gets_the_processor_with_the_config_before_the_weights(hub, tmp_path):
    seen = {}

    def before_weights(folder, tokenizer):
        seen["files"] = sorted(p.name for p in Path(tokenizer).iterdir())
        raise RuntimeError("stop before the weights")

    with pytest.raises(RuntimeError, match="stop before the weights"):
        fetch(hub_checkpoint(VIT), tmp_path / "w", retries=0, before_weights=before_weights)
    assert seen["files"] == ["config.json", "preprocessor_config.json"]


def test_an_image_model_sweeps_past_the_preflight_on_images(hub, tmp_path):
    """Up to the weights, which this cache does not hold: the preflight made the batch with the model's processor."""
    texts = corpus_file(tmp_path, {"source": "images", "paths": [str(image_folder(tmp_path / "imgs"))]})
    with pytest.raises(FetchError, match="downloading: google/vit-base-patch16-224 at revision 'main'"):
        fetch_checked(VIT, texts, tmp_path / "w")


# ------------------------------------------------------------------------------------------------ bad input


def test_an_image_folder_for_a_text_model_stops_before_the_weights(hub, tmp_path):
    texts = corpus_file(tmp_path, {"source": "images", "paths": [str(image_folder(tmp_path / "imgs"))]})
    with pytest.raises(PreflightError, match=r"corpus holds image but the model \(bert\) reads text: set the config's"):
        fetch_checked(BERT, texts, tmp_path / "w")


def test_a_text_corpus_for_an_image_model_stops_before_the_weights(hub, tmp_path, capsys):
    texts = corpus_file(tmp_path, {"source": "builtin"})
    with pytest.raises(PreflightError, match=r"corpus holds text but the model \(vit\) reads image: .*`images`"):
        fetch_checked(VIT, texts, tmp_path / "w")
    # as the fetch rule runs it: one last line naming the checkpoint and what to do
    checkpoint = json.dumps(hub_checkpoint(VIT).to_dict())
    args = ["fetch", "--checkpoint", checkpoint, "--out", str(tmp_path / "w2"), "--texts", str(texts)]
    assert cli.main([*args, "--settings", json.dumps({"n_sequences": 4}), "--retries", "0"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hub/google--vit-base-patch16-224/step0: PreflightError:") and "corpus.source" in last


def test_fewer_images_than_the_evaluation_batch_stops_before_the_weights(hub, tmp_path):
    texts = corpus_file(tmp_path, {"source": "images", "paths": [str(image_folder(tmp_path / "imgs", 3))]})
    with pytest.raises(PreflightError, match=r"holds 3 items, but extract.n_sequences = 8: lower extract.n_sequences"):
        fetch_checked(VIT, texts, tmp_path / "w", n_sequences=8)


@pytest.mark.parametrize("modality, name", [("images", "broken.png"), ("audio", "broken.wav")])
def test_a_file_that_does_not_decode_is_named_at_the_corpus_step(tmp_path, capsys, modality, name):
    folder = image_folder(tmp_path / "in") if modality == "images" else wav(tmp_path / "in" / "ok.wav", 0.2).parent
    (folder / name).write_bytes(b"this is not a picture nor a sound")
    corpus = {"source": modality, "paths": [str(folder)]}
    with pytest.raises(MediaError, match=rf"{name}' does not decode .*remove it"):
        load_media(corpus)
    out = tmp_path / "corpus.parquet"
    assert cli.main(["corpus", "--corpus", json.dumps(corpus), "--out", str(out)]) == 1
    assert name in capsys.readouterr().err.strip().splitlines()[-1] and not out.exists()


@pytest.mark.parametrize("content", ["nothing", "other files"])
def test_an_empty_folder_is_an_error_naming_what_was_looked_for(tmp_path, content):
    folder = tmp_path / "imgs"
    folder.mkdir()
    if content == "other files":
        wav(folder / "a.wav", 0.1)
    with pytest.raises(MediaError, match=r"no image files under .*imgs \(looked for \.png, \.jpg"):
        load_media({"source": "images", "paths": [str(folder)]})


def test_a_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(MediaError, match=r"corpus path '.*nowhere' does not exist"):
        load_media({"source": "audio", "paths": [str(tmp_path / "nowhere")]})


def test_a_sample_rate_the_feature_extractor_refuses_unless_resampled(tmp_path):
    wav(tmp_path / "clips" / "a.wav", 1.0, rate=16_000)
    wav(tmp_path / "clips" / "phone.wav", 1.0, rate=8_000)
    extractor = transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000, return_attention_mask=True)
    corpus = {"source": "audio", "paths": [str(tmp_path / "clips")]}
    with pytest.raises(
        MediaError, match=r"phone.wav' is sampled at 8000 Hz, .* takes 16000 Hz .*corpus.resample: true"
    ):
        make_media_batch(extractor, load_media(corpus), 2)
    batch = make_media_batch(extractor, load_media({**corpus, "resample": True}), 2)
    assert batch["attention_mask"].sum(1).tolist() == [16_000, 16_000]  # 1 s each, the 8 kHz clip upsampled


def test_a_sample_rate_is_refused_by_the_preflight_before_the_weights(tmp_path):
    """Through the preflight of a speech model's folder (its config.json and preprocessor_config.json)."""
    folder = tmp_path / "speech"
    transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(folder)
    transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000).save_pretrained(folder)
    wav(tmp_path / "clips" / "phone.wav", 0.5, rate=8_000)
    texts = corpus_file(tmp_path, {"source": "audio", "paths": [str(tmp_path / "clips")]})
    from anisweep.checkpoints.preflight import model_modality

    if model_modality(json.loads((folder / "config.json").read_text())) != "audio":
        pytest.skip("no speech adapter registered yet (anisweep.adapters)")
    with pytest.raises(PreflightError, match=r"phone.wav' is sampled at 8000 Hz"):
        evaluation_batch(folder, folder, settings(1), read_corpus(texts), "hub/speech/step0")


# ------------------------------------------------------------------------------------------------ datasets


@pytest.fixture
def image_dataset(tmp_path, monkeypatch):
    """A local dataset (Parquet files in a folder, as the Hub serves them) with an Image column `img`."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")

    def encoded(i):
        out = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), 20 * i, np.uint8)).save(out, format="PNG")
        return {"bytes": out.getvalue(), "path": None}

    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"img": [encoded(i) for i in range(5)], "label": list(range(5))}, features)
    (tmp_path / "ds" / "data").mkdir(parents=True)
    ds.to_parquet(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")
    return str(tmp_path / "ds")


def test_a_dataset_image_column_is_read(image_dataset):
    media = load_media({"source": "hf_dataset", "name": image_dataset, "modality": "image", "column": "img"})
    assert len(media) == 5 and all(Image.open(io.BytesIO(blob)).size == (8, 8) for blob in media.data)


def test_a_dataset_column_that_does_not_exist_names_the_columns(image_dataset):
    source = {"source": "hf_dataset", "name": image_dataset, "modality": "image"}  # column: `image` by default
    with pytest.raises(MediaError, match=r"has no column 'image'; its columns: img, label. Name the image column"):
        load_media(source)
    with pytest.raises(MediaError, match=r"column 'label' is a Value feature, not Image"):
        load_media({**source, "column": "label"})


def gated_errors():
    import httpx2
    from huggingface_hub.errors import GatedRepoError

    url = "https://huggingface.co/datasets/mozilla-foundation/common_voice_11_0"
    response = httpx2.Response(401, request=httpx2.Request("GET", url))
    yield GatedRepoError("401 Client Error. Cannot access gated repo for url ...", response=response)
    try:
        from datasets.exceptions import DatasetNotFoundError
    except ImportError:
        return
    yield DatasetNotFoundError(
        "Dataset 'mozilla-foundation/common_voice_11_0' is a gated dataset on the Hub. You must be authenticated "
        "to access it."
    )
    try:  # the Hub's refusal as the cause of another error, its message silent about it
        raise GatedRepoError("401 Client Error", response=response)
    except GatedRepoError as cause:
        wrapped = FileNotFoundError("Couldn't find any data file")
        wrapped.__cause__ = cause
        yield wrapped


@pytest.mark.parametrize("error", list(gated_errors()), ids=lambda e: type(e).__name__)
def test_a_gated_dataset_without_a_token_says_what_to_do(monkeypatch, error):
    """A real gated download needs the network: `datasets.load_dataset` raises what it raises for one."""
    datasets = pytest.importorskip("datasets")

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    name = "mozilla-foundation/common_voice_11_0"
    with pytest.raises(MediaError) as raised:
        load_dataset_or_explain(datasets, name, "en", "validation")
    message = str(raised.value)
    assert f"https://huggingface.co/datasets/{name}" in message and "accept its terms" in message
    assert "HF_TOKEN" in message and "hf auth login" in message and "docs/modalities.md" in message
    for corpus in (  # the text source says the same
        {"source": "hf_dataset", "name": name, "config": "en", "split": "validation", "modality": "audio"},
        {"source": "hf_dataset", "name": name, "config": "en", "split": "validation"},
    ):
        with pytest.raises(MediaError, match="is gated: accept its terms"):
            (load_media if corpus.get("modality") else load_texts)(corpus)


def test_the_corpus_file_reads_back_as_written(tmp_path):
    media = load_media({"source": "images", "paths": [str(image_folder(tmp_path / "imgs", 2))]})
    write_media(media, tmp_path / "c.parquet")
    assert read_corpus(tmp_path / "c.parquet").names == media.names
