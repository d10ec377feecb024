"""What the schema cannot say, checked when the config is read (anisweep.config), before any job: values that must
agree with each other (a bin range, the gradient sample against the rank) and with each model's shape (the rank
below d_model, the qk_svd heads inside the model), and a saved local run's config.json files (one architecture,
each step against the extract settings). Each failure is a ConfigError naming the key and what to change.
A model whose shape is unknown until it is fetched is left to the checks of the jobs. No torch here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace

from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.preflight import ModelShape, PreflightError, check_model_config, model_modality
from anisweep.errors import ConfigError


def ranks(gradients: dict) -> list[int]:
    """gradients.rank as a sorted list (it may be one rank or several)."""
    rank = gradients.get("rank", 16)
    return sorted(set(rank if isinstance(rank, list) else [rank]))


def check_sections(config: dict) -> None:
    """The checks that need no model, of a config with its defaults filled in."""
    bins = config["extract"]["score_bins"]
    if bins is not None and not bins["low"] < bins["high"]:
        raise ConfigError(
            f"extract.score_bins: low = {bins['low']} is not below high = {bins['high']}: the histogram's bins run "
            "from low to high; swap them, e.g. {low: -20, high: 20, n: 80}"
        )
    _check_gradients(config["gradients"])
    _check_untrained(config["untrained"])
    _check_corpus(config)
    for name, spec in config["toy"].items():
        _check_heads(f"toy.{name}", spec["d_model"], spec["n_heads"])
    _check_compare_seeds(config.get("compare", {}).get("seeds", []), config["toy"])


#: A toy's tokenizer by its arch (anisweep.toy.tokenizers), trained on the builtin corpus to its vocab_size.
TOY_TOKENIZERS = {"bert": "WordPiece", "gpt_neox": "byte-level BPE"}


def _check_compare_seeds(seeds: list, toys: dict) -> None:
    """A seed pair compares two models on one sample of tokens, which two tokenizers cannot share. Toys are
    checked here (a toy's tokenizer follows its arch and vocab_size); other models' tokenizers are known only once
    fetched, and a pair job of two samples of other tokens stops naming what differs."""
    for a, b in seeds:
        if a not in toys or b not in toys:
            continue
        tokenizers = {name: (TOY_TOKENIZERS.get(toys[name]["arch"]), toys[name]["vocab_size"]) for name in (a, b)}
        if tokenizers[a] != tokenizers[b]:
            named = "; ".join(f"{name}: {kind}, vocab_size {size}" for name, (kind, size) in tokenizers.items())
            raise ConfigError(
                f"compare.seeds: [{a}, {b}]: the two toys tokenize the text differently ({named}), so their samples "
                "share no token and cannot be compared; pair two toys of one arch and vocab_size (e.g. one toy trained "
                "with two seeds, toy.<name>.seed), or drop the pair"
            )


def _check_heads(where: str, d_model: int, n_heads: int) -> None:
    if d_model % n_heads:
        raise ConfigError(
            f"{where}: d_model = {d_model} is not a multiple of n_heads = {n_heads} (each head takes d_model / "
            f"n_heads dimensions); change {where}.d_model or {where}.n_heads"
        )


def _check_corpus(config: dict) -> None:
    """An image or audio corpus (anisweep.media) names its files, and feeds only models that load from a checkpoint
    folder with the model's own processor: not a toy (trained on text by the workflow), nor a model analysed while
    it trained (on text), nor the gradient analysis (the language-modelling loss of a text batch)."""
    from anisweep.media import modality_of

    corpus = config["corpus"]
    modality = modality_of(corpus)
    if modality == "text":
        return
    if corpus["source"] in ("images", "audio") and not corpus.get("paths"):
        raise ConfigError(
            f"corpus.source is {corpus['source']!r} but corpus.paths lists no folder: name the folders (or files) of "
            f"your {modality} files, e.g. corpus: {{source: {corpus['source']}, paths: [my_{corpus['source']}/]}}"
        )
    n_sequences = config["extract"]["n_sequences"]
    if corpus["max_items"] < n_sequences:
        raise ConfigError(
            f"corpus.max_items = {corpus['max_items']} is below extract.n_sequences = {n_sequences}: the evaluation "
            f"batch takes {n_sequences} of the corpus's {modality} items; raise corpus.max_items or lower "
            "extract.n_sequences"
        )
    text_only = [
        f"{e.get('family')}/{e.get('name')}"
        for e in config["models"]
        if isinstance(e, dict) and (e.get("family") == "toy" or e.get("live"))
    ]
    if text_only:
        raise ConfigError(
            f"models {', '.join(text_only)} read text (a toy the workflow trains, or a run analysed while it "
            f"trained), but the corpus holds {modality} (corpus.source {corpus['source']!r}): sweep them in a config "
            "of their own with a text corpus (corpus.source builtin, text, or hf_dataset with corpus.modality: text), "
            f"and keep here the models that read {modality} (family hub or local)"
        )
    if config["gradients"]["enabled"]:
        raise ConfigError(
            f"gradients.enabled, but the corpus holds {modality}: the gradient analysis takes the language-modelling "
            "loss of a text batch; set gradients.enabled: false for image and audio models"
        )


def _check_gradients(gradients: dict) -> None:
    if not gradients["enabled"]:
        return
    if gradients["steps"] == []:
        raise ConfigError(
            "gradients.steps is [] while gradients.enabled is true: no checkpoint would be analysed; list the steps "
            "to analyse, leave gradients.steps out (every swept step), or set gradients.enabled: false"
        )
    top = ranks(gradients)[-1]
    if gradients["sample_tokens"] < top:
        raise ConfigError(
            f"gradients.sample_tokens = {gradients['sample_tokens']} is less than gradients.rank {top}: a rank-k "
            f"subspace is fitted on the sampled tokens and needs at least k of them; raise gradients.sample_tokens "
            f"to at least {top}, or lower gradients.rank"
        )


def _check_untrained(untrained: dict) -> None:
    if not untrained["enabled"]:
        return
    norms = untrained["norms"]
    repeated = sorted({n for n in norms if norms.count(n) > 1})
    if repeated:
        raise ConfigError(f"untrained.norms: {repeated} listed more than once; list each bias norm once")
    _check_heads("untrained", untrained["d_model"], untrained["n_heads"])
    if not untrained["score_min"] < untrained["score_max"]:
        raise ConfigError(
            f"untrained: score_min = {untrained['score_min']} is not below score_max = {untrained['score_max']}; "
            "swap them"
        )


def check_models(config: dict, shapes: Mapping[str, ModelShape | None], analysed: list[str]) -> None:
    """The settings that depend on a model's shape: `shapes` by "family/model" (None where unknown before the
    model is fetched); `analysed`: the models the gradient analysis covers."""
    gradients = config.get("gradients", {})
    if gradients.get("enabled"):
        for model in analysed:
            shape = shapes.get(model)
            too_large = [r for r in ranks(gradients) if shape is not None and r >= shape.d_model]
            if too_large:
                raise ConfigError(
                    f"gradients.rank {too_large[0]} is not less than d_model = {shape.d_model} of {model}: a "
                    "subspace of rank d_model is the whole residual space, so every gradient lies in it and the "
                    "z-scores against random subspaces are rounding noise; set gradients.rank below "
                    f"{shape.d_model}, or leave {model} out of the gradient analysis (gradients.steps)"
                )
    heads = config.get("qk_svd", {}).get("heads", "auto")
    if heads == "auto":
        return
    for model, shape in shapes.items():
        if shape is None or shape.n_layers is None or shape.n_heads is None:
            continue
        outside = [list(h) for h in heads if not (h[0] < shape.n_layers and h[1] < shape.n_heads)]
        if outside:
            raise ConfigError(
                f"qk_svd.heads: {outside} are not [layer, head] pairs of {model}, which has layers "
                f"0..{shape.n_layers - 1} and heads 0..{shape.n_heads - 1}; every model's figures draw these heads, "
                "so name pairs inside each model's range, or set qk_svd.heads: auto"
            )


def check_local_runs(checkpoints: Iterable[Checkpoint], config: dict) -> None:
    """What a saved local run's config.json files tell, checked when the workflow reads the config (`config`: with its
    defaults), as a toy's spec is before it is trained, so that no job runs first: every step one architecture, and
    each step against the extract settings as its fetch checks them (its positions against seq_len, its width
    against the sample). A step without a readable config.json is left to its fetch, which names it."""
    from anisweep.media import modality_of

    settings = SimpleNamespace(**config["extract"])
    text_corpus = modality_of(config["corpus"]) == "text"
    runs: dict[str, dict[int, dict]] = {}
    folders: dict[str, Path] = {}
    for c in checkpoints:
        hf_config = _config_json(Path(c.path)) if c.family == "local" and c.path else None
        if hf_config is None:
            continue
        runs.setdefault(c.model, {})[c.step] = hf_config
        folders[c.model] = Path(c.path).parent
    for model, configs in runs.items():
        _check_one_architecture(f"local/{model}", configs, folders[model])
        for step, hf_config in sorted(configs.items()):
            if text_corpus and model_modality(hf_config) == "text":  # an image or audio model: its own checks at fetch
                try:
                    check_model_config(hf_config, settings, f"local/{model}/step{step}")
                except PreflightError as error:
                    raise ConfigError(str(error)) from None


def _config_json(folder: Path) -> dict | None:
    try:
        hf_config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return hf_config if isinstance(hf_config, dict) else None


def _architecture(hf_config: dict) -> str:
    """A config.json's model_type, with the class it names: `bert (BertModel)`."""
    classes = hf_config.get("architectures") or []
    return str(hf_config.get("model_type")) + (f" ({', '.join(classes)})" if classes else "")


def _check_one_architecture(run: str, configs: dict[int, dict], folder: Path) -> None:
    """A run's steps are one model over training: a step of another model_type (a BERT saved among GPT-NeoX steps)
    would be drawn as one training with them. Each architecture is named with its steps, the fewest first."""
    by_type: dict[str, list[int]] = {}
    for step, hf_config in sorted(configs.items()):
        by_type.setdefault(str(hf_config.get("model_type")), []).append(step)
    if len(by_type) < 2:
        return
    groups = sorted(by_type.values(), key=len)

    def named(steps: list[int]) -> str:
        shown = ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
        verb = "are" if len(steps) > 1 else "is"
        return f"step{'s' if len(steps) > 1 else ''} {shown} {verb} {_architecture(configs[steps[0]])}"

    raise ConfigError(
        f"{run}: {named(groups[0])}, but {'; '.join(named(g) for g in groups[1:])}: a run's checkpoints are one "
        f"model over training, drawn as one line. Move the other model's step folders out of {folder} (and sweep "
        "them as a run of their own), or leave those steps out of the entry's steps"
    )
