# The weight measures' constants and input functions (their rules: workflow/rules/weights.smk).
from anisweep.measures.registry import BUILTIN_WEIGHT, LENS_FIGURES, WEIGHT_FIGURES

WEIGHT_MEASURES = {name: m for name, m in MEASURES.items() if m.kind == "weight"}
# the circuits, the weights' readers, the job's table
WEIGHTS_CODE = code_inputs("weights.builtin", commands="cli.weights")
if WEIGHT_MEASURES and LIVE_MODELS:
    raise WorkflowError(
        f"config: weight measures {sorted(WEIGHT_MEASURES)} read saved weights, which the live models {LIVE_MODELS} "
        "have none of: sweep their saved checkpoints (live: false)"
    )


def has_weights(model):
    """Whether the built-in weight measure runs for a model's checkpoints: on, and the model saved (not live)."""
    return config["weights"]["enabled"] and model not in LIVE_MODELS


def weight_tables(wildcards):
    """metrics' input: the checkpoint's built-in weight measure's rows, where it has them."""
    if not has_weights(wildcards.model):
        return []
    folder = f"results/{wildcards.family}/{wildcards.model}/step{wildcards.step}"
    return [f"{folder}/weights.parquet", f"{folder}/logit_lens.parquet"]


def weight_figures(family, model):
    if not has_weights(model):
        return []
    return [f"results/{family}/{model}/figures/{name}" for name in WEIGHT_FIGURES]


def weights_only_outputs():
    """The target `weights_only`: each saved model's weight tables and circuit figures, nothing that runs a model."""
    outputs = []
    for family, model in MODELS:
        if model in LIVE_MODELS:
            continue
        if has_weights(model):  # the figures read every checkpoint's weights.parquet and weight_pairs.parquet
            outputs += [f"results/{family}/{model}/figures/{name}" for name in BUILTIN_WEIGHT["circuits"]]
        checkpoints = model_checkpoints(family, model)
        outputs += [f"results/{c.key}/measures/{name}.parquet" for c in checkpoints for name in WEIGHT_MEASURES]
    return outputs


def weights_only_run():
    """Whether the run's target is `weights_only`, which fetches nothing (range requests read what it needs): the
    targets are known once the workflow is read, when the input functions run."""
    return set(getattr(getattr(workflow, "dag_settings", None), "targets", None) or ()) == {"weights_only"}


def after_fetch(wildcards):
    """A Hub checkpoint's weight measure's wait for its fetch in a run that fetches it (a checkpoint not yet extracted),
    so that it reads the weights fetch downloaded: fetch's log, kept after the weights go (`ancient`: a later fetch,
    a model run redone, reruns nothing here). Once there, always named (the same input set each run: nothing
    reruns); never in a weights-only run, nor where the checkpoint was extracted and the log is gone, whose measures
    read by range requests instead of fetching the whole checkpoint again."""
    if not checkpoint_of(wildcards).is_hub:
        return []
    log = fetch_log(wildcards)
    info = f"results/{wildcards.family}/{wildcards.model}/step{wildcards.step}/extract.json"
    if os.path.exists(log) or not (weights_only_run() or os.path.exists(info)):
        return [ancient(log)]
    return []


def fetched_copy(reader):
    """The `--fetched` argument of a job reading a Hub checkpoint's weights: the copy its fetch shares in this run
    (read there when it exists, else by range requests); untracked, a param of how the job runs."""

    def argument(wildcards):
        if not checkpoint_of(wildcards).is_hub:
            return ""
        name = reader if reader != "measure" else f"measure-{wildcards.measure}"
        return f"--fetched {shlex.quote(shared_copy(wildcards, name))}"

    return untracked(argument)
