# The comparisons' pairs, settings and input functions (the rules: workflow/rules/compare.smk).
from anisweep.measures import compare_plan
from anisweep.plots.compare import COMPARE_FIGURES, SEED_FIGURES

COMPARE = config["compare"]
COMPARE_MEASURES = {name: m for name, m in MEASURES.items() if m.kind == "comparative"}
try:
    PAIRS = compare_plan.pairs(COMPARE, {key: [c.step for c in model_checkpoints(*key)] for key in MODELS})
except ConfigError as error:
    raise WorkflowError(f"config: {error}") from None
# each model's pairs (compare_plan.of_model), read by each model's jobs: an index, not a scan of every pair per model
PAIRS_OF_MODEL = {}
for pair in PAIRS:
    PAIRS_OF_MODEL.setdefault((pair.family, pair.model), []).append(pair)
# the settings that change the built-in measures' values, recorded (sorted JSON): another order reruns nothing
COMPARE_SETTINGS = settings_of(COMPARE, ("measures", "cka_debiased", "svcca_variance", "sites", "cca_max_width"))


def compare_outputs(family, model):
    """A model's compare.parquet and figures, where the config compares any of its checkpoints."""
    pairs = PAIRS_OF_MODEL.get((family, model), [])
    if not pairs:
        return []
    names = [*COMPARE_FIGURES, *(SEED_FIGURES if any(p.role == "seed" for p in pairs) else ())]
    figures = [f"results/{family}/{model}/figures/{name}" for name in names]
    return [f"results/{family}/{model}/compare.parquet", *figures]


def compare_inputs(wildcards):
    """The two checkpoints' sampled hidden states and extract.json."""
    folders = [
        f"results/{wildcards.family}/{wildcards.model}/step{wildcards.step}",
        f"results/{wildcards.family}/{wildcards.ref_model}/step{wildcards.ref_step}",
    ]
    return [f"{folder}/{name}" for folder in folders for name in ("hidden.parquet", "extract.json")]


def model_roles(wildcards):
    """(role, path) of every role the model's pairs play: a table in two roles is listed twice."""
    return compare_plan.roles(PAIRS_OF_MODEL.get((wildcards.family, wildcards.model), []))


def pair_intervals(wildcards):
    """The model's bootstrap.parquet where it holds the intervals of its comparisons (bootstrap.measures names one
    of cka, svcca, pwcca), for the bands of compare_training.png; none elsewhere."""
    # called while the DAG is built, after workflow/rules/bootstrap_inputs.smk and plots_inputs.smk are read
    if not set(BOOTSTRAP["measures"]) & {"cka", "svcca", "pwcca"}:
        return []
    return model_intervals(wildcards)
