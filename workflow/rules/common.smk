import json
import shlex
import sys

from snakemake.utils import validate

from anisweep import config as anisweep_config
from anisweep.plots import MODEL_FIGURES
from anisweep.sources import ConfigError


validate(config, schema="../schemas/config.schema.yaml")

# Every rule calls the package's CLI with the interpreter that runs Snakemake, so an unactivated
# virtual environment works as well as an activated one.
ANISWEEP = f"{shlex.quote(sys.executable)} -m anisweep"

try:
    CHECKPOINTS = {c.key: c for c in anisweep_config.checkpoints(config)}
except ConfigError as error:
    raise WorkflowError(f"config: {error}") from None

MODELS = anisweep_config.models(config)


wildcard_constraints:
    family="[a-z0-9_]+",
    model="[^/]+",
    step="[0-9]+",


def checkpoint_of(wildcards):
    key = f"{wildcards.family}/{wildcards.model}/step{wildcards.step}"
    if key not in CHECKPOINTS:
        raise WorkflowError(f"{key} is not a checkpoint of this config; add its model and step under `models:`")
    return CHECKPOINTS[key]


def json_arg(value):
    return shlex.quote(json.dumps(value))


def model_checkpoints(family, model):
    return [c for c in CHECKPOINTS.values() if c.family == family and c.model == model]


def model_metrics(wildcards):
    return [f"results/{c.key}/metrics.parquet" for c in model_checkpoints(wildcards.family, wildcards.model)]


def figures(family, model):
    return [f"results/{family}/{model}/figures/{name}" for name in MODEL_FIGURES]


def all_outputs():
    outputs = []
    for family, model in MODELS:
        outputs += [f"results/{family}/{model}/sweep.parquet", *figures(family, model)]
    for family in sorted({family for family, _ in MODELS}):
        outputs.append(f"results/{family}/figures/compare.png")
    return outputs
