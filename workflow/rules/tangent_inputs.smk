# The gradient analysis's checkpoints, inputs and targets (its rules: workflow/rules/tangent.smk).
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
    steps = window_steps([c.step for c in checkpoints], GRADIENTS["fit_window"], f"{family}/{model}")
    return [c for c in checkpoints if c.step in steps]


FIXED_SUBSPACES = GRADIENTS["subspaces"] != "per_checkpoint"
EMBEDDING_CHANGE = GRADIENTS["embedding_change"]
try:
    check_gradient_config(
        GRADIENTS, {f"{f}/{m}": [c.step for c in model_checkpoints(f, m)] for f, m in gradient_models()}
    )
except ConfigError as error:
    raise WorkflowError(f"config: {error}") from None


def gradient_inputs(wildcards):
    fixed = [f"results/{wildcards.family}/{wildcards.model}/gradient_fixed_bases.parquet"] if FIXED_SUBSPACES else []
    return {"fixed": fixed}


def gradient_extra_args(wildcards, input, output):
    args = f"--fixed-bases {input.fixed}" if input.fixed else ""
    if EMBEDDING_CHANGE:
        args += f" --bases-out {output.bases} --embeddings-out {output.embeddings}"
    return args


# With gradients.embedding_change: the layer-0 bases and the kept token-embedding rows, for gradients_sweep.
GRADIENT_EXTRA_OUTPUTS = (
    {
        "bases": "results/{family}/{model}/step{step}/gradient_bases.parquet",
        "embeddings": "results/{family}/{model}/step{step}/embedding_rows.parquet",
    }
    if EMBEDDING_CHANGE
    else {}
)


def gradient_sweep_inputs(wildcards):
    checkpoints = gradient_checkpoints(wildcards.family, wildcards.model)
    inputs = {"tables": [f"results/{c.key}/gradients.parquet" for c in checkpoints]}
    if EMBEDDING_CHANGE:
        inputs["bases"] = [f"results/{c.key}/gradient_bases.parquet" for c in checkpoints]
        inputs["embeddings"] = [f"results/{c.key}/embedding_rows.parquet" for c in checkpoints]
        if FIXED_SUBSPACES:
            inputs["fixed"] = f"results/{wildcards.family}/{wildcards.model}/gradient_fixed_bases.parquet"
    return inputs


def gradient_sweep_args(wildcards, input):
    if not EMBEDDING_CHANGE:
        return ""
    args = f"--bases {input.bases} --embeddings {input.embeddings}"
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
