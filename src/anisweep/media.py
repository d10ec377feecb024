"""Images and audio as the evaluation corpus: chosen, checked and stored by the corpus step, turned into a batch
by the model's own processor at extract.

Two sources (:func:`load_media`):

* ``{"source": "images" | "audio", "paths": [DIR or FILE, ...]}``: every file with an image (audio) suffix under
  the folders, in sorted order, then a seeded choice of ``max_items`` of them;
* ``{"source": "hf_dataset", "name": ..., "column": ..., "modality": "image" | "audio"}``: a Hugging Face dataset
  whose column is an ``Image`` or ``Audio`` feature (read undecoded: the encoded bytes).

The corpus file (``resources/corpus.parquet``) holds the chosen items' encoded bytes, so a sweep reads the same
inputs wherever it runs and reruns when they change. Every chosen item is decoded once at the corpus step: a
file that does not decode stops the run there, named.

:func:`make_media_batch` gives extract's batch: the first ``n_sequences`` items (already in the seeded order)
through the checkpoint's processor (``AutoImageProcessor`` / ``AutoFeatureExtractor``), its tensors keyed as the
model takes them (``pixel_values``; ``input_values`` and ``attention_mask``; Whisper's ``input_features``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODALITIES = ("image", "audio")
SOURCE_MODALITY = {"images": "image", "audio": "audio"}
SUFFIXES = {
    "image": (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"),
    "audio": (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif"),
}
DEFAULT_MAX_ITEMS = 512
DEFAULT_MAX_SECONDS = 10.0


class MediaError(ValueError):
    pass


@dataclass(frozen=True)
class MediaCorpus:
    """The chosen items of an image or audio corpus, in their seeded order: names and encoded bytes. `resample`:
    audio at another rate than the processor's is resampled (else an error); `max_seconds`: longer clips are cut."""

    modality: str
    names: tuple[str, ...]
    data: tuple[bytes, ...]
    resample: bool = False
    max_seconds: float = DEFAULT_MAX_SECONDS

    def __len__(self) -> int:
        return len(self.names)


def modality_of(source: Mapping[str, Any]) -> str:
    """`text`, `image` or `audio`: what a corpus section holds."""
    kind = source.get("source", "builtin")
    if kind in SOURCE_MODALITY:
        return SOURCE_MODALITY[kind]
    return source.get("modality", "text") if kind == "hf_dataset" else "text"


#: the corpus keys only an image or audio corpus reads, and those only audio reads
MEDIA_KEYS = ("modality", "max_items", "seed", "resample", "max_seconds")
AUDIO_KEYS = ("resample", "max_seconds")


def corpus_settings(source: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a corpus section that change the corpus step's file (the corpus rule's params): a text corpus
    without the media keys, an image corpus without the audio ones, so that a key a corpus does not read (or the
    schema's default of one, filled in) reruns nothing."""
    modality = modality_of(source)
    unread = MEDIA_KEYS if modality == "text" else AUDIO_KEYS if modality == "image" else ()
    return {key: value for key, value in source.items() if key not in unread}


# --------------------------------------------------------------------------------------------- decoding


def decode_image(data: bytes, name: str):
    """An RGB PIL image; a file PIL cannot read is a MediaError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise MediaError(
            f"corpus image {name!r} does not decode ({error}); remove it from the folder or re-save it "
            f"as PNG or JPEG (supported: {', '.join(SUFFIXES['image'])})"
        ) from None
    return image.convert("RGB")


def decode_audio(data: bytes, name: str) -> tuple[np.ndarray, int]:
    """(mono float32 samples, sampling rate); channels are averaged. A file libsndfile cannot read is a MediaError
    naming it."""
    import soundfile

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise MediaError(
            f"corpus audio file {name!r} does not decode ({error}); remove it or convert it to WAV or FLAC "
            f"(e.g. `ffmpeg -i {Path(name).name} {Path(name).stem}.flac`)"
        ) from None
    if samples.shape[0] == 0:
        raise MediaError(f"corpus audio file {name!r} holds no samples; remove it")
    return samples.mean(axis=1), int(rate)


def check_decodes(modality: str, names: Sequence[str], data: Sequence[bytes]) -> None:
    decode = decode_image if modality == "image" else decode_audio
    for name, blob in zip(names, data):
        decode(blob, name)


# --------------------------------------------------------------------------------------------- sources


def media_files(paths: Sequence[str | Path], modality: str) -> list[Path]:
    """The files of `modality` under `paths` (folders, searched recursively, or files), sorted, deduplicated."""
    suffixes = SUFFIXES[modality]
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found.update(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
        elif path.is_file():
            found.add(path)
        else:
            raise MediaError(f"corpus path {str(raw)!r} does not exist (resolved to {path.resolve()})")
    files = sorted(found)
    if not files:
        other = [m for m in MODALITIES if m != modality][0]
        raise MediaError(
            f"no {modality} files under {', '.join(map(str, paths))} (looked for {', '.join(suffixes)}); "
            f"name folders of {modality} files, or set corpus.source to `{'images' if other == 'image' else other}` "
            "or `text` if that is what they hold"
        )
    return files


def _choose(n: int, max_items: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).permutation(n)[:max_items]]


def load_media(source: Mapping[str, Any]) -> MediaCorpus:
    """The chosen items of an `images`, `audio` or media `hf_dataset` corpus section, each checked to decode."""
    modality = modality_of(source)
    if modality not in MODALITIES:
        raise MediaError(f"corpus.modality must be one of {', '.join(MODALITIES)}, got {modality!r}")
    max_items = int(source.get("max_items", DEFAULT_MAX_ITEMS))
    seed = int(source.get("seed", 0))
    if source.get("source") == "hf_dataset":
        names, data = _dataset_items(source, modality, max_items, seed)
    else:
        files = media_files(source.get("paths") or [], modality)
        chosen = [files[i] for i in _choose(len(files), max_items, seed)]
        names, data = [str(p) for p in chosen], [p.read_bytes() for p in chosen]
    check_decodes(modality, names, data)
    return MediaCorpus(
        modality,
        tuple(names),
        tuple(data),
        resample=bool(source.get("resample", False)),
        max_seconds=float(source.get("max_seconds", DEFAULT_MAX_SECONDS)),
    )


def _dataset_items(source: Mapping[str, Any], modality: str, max_items: int, seed: int):
    """(names, encoded bytes) of a seeded choice of a dataset's Image / Audio column, read without decoding."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError("corpus source 'hf_dataset' needs the `datasets` package: pip install datasets") from exc
    name = source.get("name")
    if not name:
        raise MediaError("corpus source 'hf_dataset' needs a dataset 'name'")
    column = source.get("column") or modality
    split = source.get("split", "train")
    ds = load_dataset_or_explain(datasets, name, source.get("config"), split)
    if column not in ds.column_names:
        raise MediaError(
            f"dataset {name!r} (split {split!r}) has no column {column!r}; its columns: {', '.join(ds.column_names)}. "
            f"Name the {modality} column as corpus.column"
        )
    feature = datasets.Image(decode=False) if modality == "image" else datasets.Audio(decode=False)
    if type(ds.features[column]).__name__ != type(feature).__name__:
        raise MediaError(
            f"dataset {name!r}: column {column!r} is a {type(ds.features[column]).__name__} feature, not "
            f"{type(feature).__name__}: corpus.modality is {modality!r}; name the dataset's "
            f"{type(feature).__name__} column, or set corpus.modality to what the column holds"
        )
    ds = ds.cast_column(column, feature)
    names, data = [], []
    for i in _choose(len(ds), max_items, seed):
        item = ds[i][column]
        blob = item.get("bytes") or (Path(item["path"]).read_bytes() if item.get("path") else None)
        if blob is None:
            raise MediaError(f"dataset {name!r}: row {i} of column {column!r} holds no {modality}")
        names.append(f"{name}[{split}][{i}]" + (f" ({Path(item['path']).name})" if item.get("path") else ""))
        data.append(blob)
    return names, data


def load_dataset_or_explain(datasets, name: str, config: str | None, split: str):
    """`datasets.load_dataset`, with a gated dataset's refusal turned into what to do."""
    from huggingface_hub.errors import GatedRepoError

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as error:  # datasets wraps the Hub's refusal in its own errors (DatasetNotFoundError)
        chain, cause = [], error
        while cause is not None and len(chain) < 10:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        if any(isinstance(e, GatedRepoError) or "gated" in str(e).lower() for e in chain):
            raise MediaError(gated_message(name)) from None
        raise


def gated_message(name: str) -> str:
    return (
        f"the dataset {name!r} is gated: accept its terms at https://huggingface.co/datasets/{name} with your account, "
        "then log in (`hf auth login`) or set HF_TOKEN, and run again; or use an ungated dataset (docs/modalities.md)"
    )


# --------------------------------------------------------------------------------------------- the corpus file


def write_media(corpus: MediaCorpus, path: str | Path) -> None:
    """The corpus as Parquet (name, modality, data, and the options the batch needs), written atomically."""
    import polars as pl

    from anisweep.tables import write_atomic

    n = len(corpus)
    frame = pl.DataFrame(
        {
            "name": list(corpus.names),
            "modality": [corpus.modality] * n,
            "data": list(corpus.data),
            "resample": [corpus.resample] * n,
            "max_seconds": [corpus.max_seconds] * n,
        },
        schema={
            "name": pl.String,
            "modality": pl.String,
            "data": pl.Binary,
            "resample": pl.Boolean,
            "max_seconds": pl.Float64,
        },
    )
    write_atomic(frame, path)


def read_media(frame) -> MediaCorpus:
    return MediaCorpus(
        frame["modality"][0],
        tuple(frame["name"].to_list()),
        tuple(frame["data"].to_list()),
        resample=bool(frame["resample"][0]),
        max_seconds=float(frame["max_seconds"][0]),
    )


# --------------------------------------------------------------------------------------------- the batch


def load_processor(folder: str | Path, modality: str, where: str):
    """The checkpoint's image processor or feature extractor (its preprocessor_config.json)."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    auto = AutoImageProcessor if modality == "image" else AutoFeatureExtractor
    try:
        return auto.from_pretrained(str(folder))
    except (OSError, ValueError) as error:
        raise MediaError(
            f"{where}: cannot load its {auto.__name__[4:]} from {folder} ({error}); the checkpoint needs its "
            "preprocessor_config.json"
        ) from None


def make_media_batch(processor, corpus: MediaCorpus, n_sequences: int) -> dict:
    """The first `n_sequences` items through `processor`, as the model's input tensors. Audio is cut to
    `corpus.max_seconds` and padded to the longest clip (``attention_mask`` marks the samples) where the
    processor pads; a clip at another rate than the processor's is resampled only with `corpus.resample`."""
    if len(corpus) < n_sequences:
        raise MediaError(
            f"the {corpus.modality} corpus holds {len(corpus)} items, but extract.n_sequences = {n_sequences}: "
            f"lower extract.n_sequences, or add files (raise corpus.max_items if it caps them)"
        )
    names, data = corpus.names[:n_sequences], corpus.data[:n_sequences]
    if corpus.modality == "image":
        images = [decode_image(blob, name) for name, blob in zip(names, data)]
        return {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]}
    rate = int(processor.sampling_rate)
    clips = [_clip(name, blob, rate, corpus) for name, blob in zip(names, data)]
    # Whisper's extractor pads (and cuts) every clip to its fixed window, `n_samples` (30 s), the only length its
    # encoder takes; the others pad to the longest clip
    padding = "max_length" if getattr(processor, "n_samples", None) else True
    out = processor(clips, sampling_rate=rate, return_tensors="pt", padding=padding, return_attention_mask=True)
    return {key: value for key, value in out.items() if key in ("input_values", "input_features", "attention_mask")}


def _clip(name: str, blob: bytes, rate: int, corpus: MediaCorpus) -> np.ndarray:
    samples, own_rate = decode_audio(blob, name)
    if own_rate != rate:
        if not corpus.resample:
            raise MediaError(
                f"corpus audio file {name!r} is sampled at {own_rate} Hz, but the model's feature extractor takes "
                f"{rate} Hz only; resample the files, or set corpus.resample: true to resample them as they are read"
            )
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(rate, own_rate)
        samples = resample_poly(samples, rate // g, own_rate // g).astype(np.float32)
    return samples[: int(corpus.max_seconds * rate)]
