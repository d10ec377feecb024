"""What a checkpoint's config.json and tokenizer (kilobytes) can tell is checked before its weights are
downloaded or read: the model's positions against `extract.seq_len`, its width against the hidden-state
sample, the tokenizer's presence, the corpus against `n_sequences x seq_len` with that tokenizer, the batch's share of
unknown tokens (text the tokenizer cannot read) against `extract.max_unknown_token_share`, and the batch's token
ids against the model's vocabulary.
Each failure is a PreflightError that names the key, folder or file to change.

fetch runs these checks between the small files and the weights; extract runs them again on what it
loads (cheap) and uses the evaluation batch they build.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple


class PreflightError(ValueError):
    pass


class ModelShape(NamedTuple):
    """What the config's per-model settings are checked against: the residual width, blocks and query heads."""

    d_model: int
    n_layers: int | None = None
    n_heads: int | None = None


def _first(hf_config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    value = next((hf_config[k] for k in keys if isinstance(hf_config.get(k), int)), None)
    return value if value and value > 0 else None


def shape_of(hf_config: dict[str, Any]) -> ModelShape | None:
    """A config.json's shape, whatever the architecture names its keys (GPT-2: n_embd, n_layer, n_head); None
    without a width."""
    d_model = _first(hf_config, ("hidden_size", "d_model", "n_embd"))
    if d_model is None:
        return None
    layers = _first(hf_config, ("num_hidden_layers", "n_layer", "n_layers"))
    encoder = _first(hf_config, ("num_layers",))  # T5: encoder blocks; the tables count on through the decoder
    if layers is None and encoder is not None:
        layers = encoder + (_first(hf_config, ("num_decoder_layers",)) or encoder)
    return ModelShape(d_model, layers, _first(hf_config, ("num_attention_heads", "n_head", "n_heads", "num_heads")))


def folder_shape(folder: str | Path) -> ModelShape | None:
    """The shape in `folder`/config.json; None where there is none to read (checked again at fetch)."""
    try:
        hf_config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return shape_of(hf_config) if isinstance(hf_config, dict) else None


def check_model_config(hf_config: dict[str, Any], settings: Any, where: str) -> None:
    """`settings` is an ExtractSettings (seq_len, n_sequences, sample_tokens); `where` names the checkpoint."""
    key = next((k for k in ("max_position_embeddings", "n_positions") if hf_config.get(k)), None)  # GPT-2: n_positions
    positions = hf_config.get(key) if key else None
    if positions and settings.seq_len > positions:
        raise PreflightError(
            f"{where}: extract.seq_len = {settings.seq_len} is longer than the {positions} positions the model has "
            f"({key}); set extract.seq_len to at most {positions}"
        )
    shape = shape_of(hf_config)
    d_model = shape.d_model if shape else None
    rate = hf_config.get("downsampling_rate") or 1  # CANINE: the layers see one position per `rate` characters
    recorded = settings.n_sequences * (settings.seq_len // rate)
    sampled = min(settings.sample_tokens, recorded)
    if d_model and sampled < d_model:
        per = f" / downsampling_rate {rate}" if rate > 1 else ""
        cause = (
            f"extract.sample_tokens = {settings.sample_tokens}"
            if settings.sample_tokens < d_model
            else f"the evaluation batch (n_sequences x seq_len{per} = {recorded} positions)"
        )
        raise PreflightError(
            f"{where}: {cause} keeps fewer hidden-state samples than d_model = {d_model}: IsoScore and the spectra "
            f"need at least d_model points per site; raise extract.sample_tokens (and the batch) to at least {d_model}"
        )


def load_tokenizer(source: str | Path | None, model_dir: str | Path, where: str):
    """The tokenizer at `source` (a folder or a Hub id); none at all is an error, never an empty tokenizer
    that maps every word to the unknown token."""
    if source is None:
        folder = Path(model_dir)
        raise PreflightError(
            f"{where}: no tokenizer files in {folder} or {folder.parent} (tokenizer.json, vocab.txt, ...): copy the "
            "run's tokenizer into the run folder, or name one in its models entry: `tokenizer: <folder or Hub id>`"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise PreflightError(f"{where}: cannot load the tokenizer {source}: {error}") from None
    if len(tokenizer) < 2:
        raise PreflightError(f"{where}: the tokenizer at {source} has an empty vocabulary")
    return tokenizer


def evaluation_batch(
    model_dir: str | Path, tokenizer_source: str | Path | None, settings: Any, texts: Sequence[str], where: str
) -> dict:
    """Every check, then the evaluation batch (`input_ids`, `attention_mask`) the checkpoint will run on."""
    from anisweep.corpus import make_batch

    config_path = Path(model_dir) / "config.json"
    try:
        hf_config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise PreflightError(f"{where}: cannot read {config_path}: {error}") from None
    corpus_modality, modality = getattr(texts, "modality", "text"), model_modality(hf_config)
    if corpus_modality != modality:
        raise PreflightError(modality_mismatch(where, hf_config, modality, corpus_modality))
    if modality != "text":
        return media_batch(model_dir, tokenizer_source, settings, texts, where)
    check_model_config(hf_config, settings, where)
    tokenizer = load_tokenizer(tokenizer_source, model_dir, where)
    try:
        batch = make_batch(tokenizer, texts, settings.n_sequences, settings.seq_len, settings.seed)
    except ValueError as error:
        raise PreflightError(f"{where}: {error} (the config's corpus and extract sections)") from None
    check_unknown_tokens(tokenizer, batch, texts, settings.max_unknown_token_share, tokenizer_source, where)
    check_vocabulary(hf_config, len(tokenizer), int(batch["input_ids"].max()), tokenizer_source, where)
    return batch


def model_modality(hf_config: dict[str, Any]) -> str:
    """What the architecture of a config.json reads (its adapter's `modality`); `text` for one no adapter knows
    (named by the adapter lookup later)."""
    from anisweep.adapters import ADAPTERS

    model_type = hf_config.get("model_type")
    return next((a.modality for a in ADAPTERS if model_type in a.model_types), "text")


def check_corpus_modality(hf_config: dict[str, Any], corpus: dict[str, Any], where: str) -> None:
    """`evaluation_batch`'s modality check, made when the config is read from a config.json already on disk (a local
    run's, a Hub checkpoint's in the cache): a mismatch stops the workflow before the corpus step downloads a
    dataset (`corpus`: the config's section)."""
    from anisweep.media import modality_of

    corpus_modality, modality = modality_of(corpus), model_modality(hf_config)
    if corpus_modality != modality:
        raise PreflightError(modality_mismatch(where, hf_config, modality, corpus_modality))


def modality_mismatch(where: str, hf_config: dict[str, Any], modality: str, corpus_modality: str) -> str:
    sources = {"text": "`builtin`, `text` or a text `hf_dataset`", "image": "`images`", "audio": "`audio`"}
    return (
        f"{where}: the corpus holds {corpus_modality} but the model ({hf_config.get('model_type')}) reads {modality}: "
        f"set the config's corpus.source to {sources[modality]} (with corpus.modality for a Hugging Face dataset), "
        f"or sweep a model that reads {corpus_modality}"
    )


def media_batch(model_dir: str | Path, processor_dir: str | Path | None, settings: Any, corpus, where: str) -> dict:
    """An image or audio model's evaluation batch, made by its own processor (anisweep.media)."""
    from anisweep.media import MediaError, load_processor, make_media_batch

    check_media_sample(model_dir, settings, where)
    try:
        processor = load_processor(processor_dir or model_dir, corpus.modality, where)
        return make_media_batch(processor, corpus, settings.n_sequences)
    except MediaError as error:
        message = str(error)
        raise PreflightError(message if message.startswith(where) else f"{where}: {message}") from None


def check_media_sample(model_dir: str | Path, settings: Any, where: str) -> None:
    """The hidden-state sample against the widest site of an image or audio model (a ResNet's last stage is 2048
    wide), which its adapter's geometry knows: IsoScore and the spectra need at least that many points per site."""
    from transformers import AutoConfig

    from anisweep.adapters import adapter_for

    config = AutoConfig.from_pretrained(str(model_dir))
    width = adapter_for(config).geometry(config).d_model
    if settings.sample_tokens < width:
        raise PreflightError(
            f"{where}: extract.sample_tokens = {settings.sample_tokens} keeps fewer hidden-state samples than the "
            f"model's widest site ({width}): IsoScore and the spectra need at least that many points per site; raise "
            f"extract.sample_tokens to at least {width}"
        )


def check_unknown_tokens(tokenizer, batch: dict, texts: Sequence[str], limit: float, source: Any, where: str) -> None:
    """A corpus the tokenizer cannot read (another language or script than its vocabulary's) turns into the
    unknown token, and the model would be analysed on a handful of ids: above `limit` (a share of the batch's
    valid tokens) it is a PreflightError naming the share, the token, the tokenizer and a text it cannot read."""
    from anisweep.corpus import unknown_token_share

    share = unknown_token_share(batch)
    if share is None or share <= limit:
        return
    unk = tokenizer.unk_token_id
    sample = _unreadable_text(tokenizer, texts, unk)
    raise PreflightError(
        f"{where}: {share:.1%} of the evaluation batch's {int(batch['attention_mask'].sum())} tokens are the "
        f"unknown token {tokenizer.unk_token!r} (id {unk}) of the tokenizer {source}: it cannot read the corpus, "
        f"e.g. {sample!r}. Use a corpus in the language the model was trained on (the config's corpus section) "
        f"or the model's own tokenizer; or raise extract.max_unknown_token_share (now {limit}) to analyse it anyway"
    )


def _unreadable_text(tokenizer, texts: Sequence[str], unk: int, looked_at: int = 200, chars: int = 60) -> str:
    """Text around the first unknown token of the first text (of the first `looked_at`) that has one."""
    for text in texts[:looked_at]:
        try:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            offsets = encoded["offset_mapping"]
        except (NotImplementedError, KeyError, ValueError):  # a tokenizer without offsets: the text's start
            encoded, offsets = tokenizer(text, add_special_tokens=False, verbose=False), None
        ids = list(encoded["input_ids"])
        if unk in ids:
            start = offsets[ids.index(unk)][0] if offsets else 0
            return text[max(0, start - chars // 4) :][:chars]
    return texts[0][:chars] if texts else ""


def check_vocabulary(hf_config: dict[str, Any], n_tokens: int, max_id: int, source: Any, where: str) -> None:
    """The evaluation batch's token ids must index the model's embedding table (config.json's vocab_size): a
    larger tokenizer is another model's, and its ids would fail in the embedding lookup after the weights load."""
    vocab = _first(hf_config, ("vocab_size",))
    if vocab is not None and max_id >= vocab:
        raise PreflightError(
            f"{where}: the tokenizer {source} ({n_tokens} tokens) gives token id {max_id} in the evaluation batch, "
            f"but the model's embedding table has vocab_size = {vocab} rows (its config.json): the tokenizer is "
            "not this model's. Name the model's own tokenizer (`tokenizer: <folder or Hub id>` in its models "
            "entry), or copy it into the run folder"
        )
