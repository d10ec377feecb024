"""What the schema cannot say, checked when the config is read (anisweep.config), before any job: values that must
agree with each other (a bin range, the gradient sample against the rank) and with each model's shape (the rank
below d_model, the qk_svd heads inside the model). Each failure is a ConfigError naming the key and what to change.
A model whose shape is unknown until it is fetched is left to the checks of the jobs. No torch here."""

from __future__ import annotations

from collections.abc import Mapping

from anisweep.checkpoints.preflight import ModelShape
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
