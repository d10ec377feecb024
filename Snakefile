# anisweep: how the geometry of transformer representations forms during training.
# `snakemake --cores 2` runs the embedded default config (config/config.yaml) offline.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/fetch.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/metrics.smk"
include: "workflow/rules/plots.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
