# The gradient analysis's checkpoints, inputs and targets (its rules: workflow/rules/tangent.smk).
from anisweep.checkpoints.identity import token_counts_identity
from anisweep.plots.gradients import gradient_figures
from anisweep.tangent.fixed import check_config as check_gradient_config, window_steps

# The gradient analysis (config `gradients`, workflow/rules/tangent.smk): which checkpoints, which targets.
GRADIENTS = config["gradients"]


def gradient_checkpoints(family, model):
    """The model's checkpoints the gradient analysis runs on: gradients.steps among its swept steps."""
    steps = GRADIENTS["steps"]
    return [c for c in model_checkpoints(family, model) if steps is None or c.step in steps]


def check_gradient_steps():
    if not GRADIENTS["enabled"] or GRADIENTS["steps"] is None:
        return
    swept = {c.step for c in CHECKPOINTS.values()}
    unknown = sorted(set(GRADIENTS["steps"]) - swept)
    if unknown:
        raise WorkflowError(
            f"config: gradients.steps {unknown} are not swept steps of any model; choose among {sorted(swept)}"
        )


check_gradient_steps()


def gradient_models():
    return [(family, model) for family, model in MODELS if gradient_checkpoints(family, model)]


def fixed_window_checkpoints(family, model):
    """The model's swept checkpoints whose extract samples fit its fixed subspaces (gradients.fit_window)."""
    checkpoints = model_checkpoints(family, model)
    steps = window_steps(
        [c.step for c in checkpoints], GRADIENTS["fit_window"], f"{family}/{model}", final_step(checkpoints)
    )
    return [c for c in checkpoints if c.step in steps]


FIXED_SUBSPACES = GRADIENTS["subspaces"] != "per_checkpoint"
EMBEDDING_CHANGE = GRADIENTS["embedding_change"]
try:
    check_gradient_config(
        GRADIENTS,
        {f"{f}/{m}": [c.step for c in model_checkpoints(f, m)] for f, m in gradient_models()},
        {f"{f}/{m}": final_step(model_checkpoints(f, m)) for f, m in gradient_models()},
    )
except ConfigError as error:
    raise WorkflowError(f"config: {error}") from None


# What each gradient rule's output depends on, as recorded params (settings_of): the backward pass (in the
# checkpoint's extract job, the only one holding the weights) on PASS_KEYS alone, so that ranks, controls, the
# fixed subspaces and the fits rerun no model. A rank written as 8 or [8] is the same setting.
GRADIENT_SETTINGS = {
    **GRADIENTS,
    "rank": sorted({GRADIENTS["rank"]} if isinstance(GRADIENTS["rank"], int) else set(GRADIENTS["rank"])),
}
PASS_KEYS = ["layers", "final_ln", "sample_tokens", "mlm_probability", "seed", "embedding_change"]
PASS_KEYS.extend(["embedding_tokens"] if EMBEDDING_CHANGE else [])
SHARES_KEYS = ["rank", "n_random", "max_iter", "seed"]
FIXED_BASES_KEYS = ["layers", "final_ln", "rank", "max_iter", "seed"]
FIXED_SHARES_KEYS = ["rank", "n_random", "seed"]
SWEEP_KEYS = ["n_random", "seed", "subspaces", "embedding_change"]


def gradient_settings_of(keys):
    return settings_of(GRADIENT_SETTINGS, keys)


def in_gradient_steps(wildcards):
    """Whether gradients.steps (all when null) holds the wildcards' checkpoint, the analysis on or off."""
    steps = GRADIENTS["steps"]
    return steps is None or int(wildcards.step) in steps


def covered(wildcards):
    """Whether the gradient analysis covers the wildcards' checkpoint."""
    return GRADIENTS["enabled"] and in_gradient_steps(wildcards)


def gradient_pass_settings(wildcards):
    """extract's recorded param: the backward pass's settings where gradients.steps holds the checkpoint, else "".
    The same with the analysis on or off, so that turning it off reruns nothing (the pass tables stay) and turning
    it on reruns only the checkpoints without them."""
    if not in_gradient_steps(wildcards):
        return ""
    counts = token_counts_identity(checkpoint_of(wildcards))  # a local run's corpus counts, for the strata
    return gradient_settings_of(PASS_KEYS) + (json_arg(counts) if counts else "")


def gradient_pass_arg(wildcards):
    """extract's --gradients: where the analysis is on, every checkpoint's extract writes the pass tables (without
    rows where the analysis does not cover it)."""
    if not GRADIENTS["enabled"]:
        return ""
    return f"--gradients {json_arg({**GRADIENTS, 'steps': None if covered(wildcards) else []})}"


# The backward pass's tables, written by extract where gradients.enabled (anisweep.tangent.pass_tables).
GRADIENT_PASS_TABLES = (
    ["gradient_sums", "gradient_sample", *(["embedding_rows"] if EMBEDDING_CHANGE else [])]
    if GRADIENTS["enabled"]
    else []
)

# With gradients.embedding_change: the layer-0 bases, for gradients_sweep.
GRADIENT_EXTRA_OUTPUTS = (
    {"bases": "results/{family}/{model}/step{step}/gradient_bases.parquet"} if EMBEDDING_CHANGE else {}
)


def gradient_extra_args(wildcards, output):
    return f"--bases-out {output.bases}" if EMBEDDING_CHANGE else ""


def fixed_shares_of(wildcards):
    """The model's shares in its fixed subspaces (gradients.subspaces fixed | both), a table the sweep joins."""
    if not (GRADIENTS["enabled"] and FIXED_SUBSPACES and gradient_checkpoints(wildcards.family, wildcards.model)):
        return []
    return [f"results/{wildcards.family}/{wildcards.model}/gradient_fixed_shares.parquet"]


def gradient_sweep_inputs(wildcards):
    checkpoints = gradient_checkpoints(wildcards.family, wildcards.model)
    inputs = {
        "tables": [f"results/{c.key}/gradients.parquet" for c in checkpoints],
        "fixed_shares": fixed_shares_of(wildcards),
    }
    if EMBEDDING_CHANGE:
        inputs["bases"] = [f"results/{c.key}/gradient_bases.parquet" for c in checkpoints]
        inputs["embeddings"] = [f"results/{c.key}/embedding_rows.parquet" for c in checkpoints]
        if FIXED_SUBSPACES:
            inputs["fixed"] = f"results/{wildcards.family}/{wildcards.model}/gradient_fixed_bases.parquet"
    return inputs


def gradient_sweep_args(wildcards, input):
    args = f"--fixed-shares {input.fixed_shares}" if input.fixed_shares else ""
    if not EMBEDDING_CHANGE:
        return args
    args += f" --bases {input.bases} --embeddings {input.embeddings}"
    return args + (f" --fixed-bases {input.fixed}" if FIXED_SUBSPACES else "")


def gradient_table_of(wildcards):
    """metrics' optional input: the checkpoint's gradients.parquet where the gradient analysis covers it."""
    if not GRADIENTS["enabled"]:
        return []
    covered = {c.step for c in gradient_checkpoints(wildcards.family, wildcards.model)}
    if int(wildcards.step) not in covered:
        return []
    return [f"results/{wildcards.family}/{wildcards.model}/step{wildcards.step}/gradients.parquet"]


def gradient_outputs():
    """The gradient targets of the default target: per model, its table and figures (none unless gradients.enabled)."""
    if not GRADIENTS["enabled"]:
        return []
    outputs = []
    for family, model in MODELS:
        if gradient_checkpoints(family, model):
            outputs.append(f"results/{family}/{model}/gradients_sweep.parquet")
            outputs += [f"results/{family}/{model}/figures/{name}" for name in gradient_figures(GRADIENTS)]
    return outputs
