# anisweep: how the geometry of transformer representations forms during training.
# `snakemake --cores 2` runs the embedded default config (config/config.yaml) offline.
from snakemake.utils import min_version

min_version("9.0")


# The embedded default config, used only when no --configfile is given: a user's config is never merged into it
# (a key the user leaves out takes the schema's default, not this file's value). --config KEY=VALUE still
# overrides either.
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/tangent_inputs.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/checkpoints_inputs.smk"
include: "workflow/rules/checkpoints.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/tangent.smk"
include: "workflow/rules/measures.smk"
include: "workflow/rules/compare_inputs.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/bootstrap_inputs.smk"
include: "workflow/rules/bootstrap.smk"
include: "workflow/rules/weights_inputs.smk"
include: "workflow/rules/weights.smk"
include: "workflow/rules/mechanism.smk"
include: "workflow/rules/plots_inputs.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/live_inputs.smk"
include: "workflow/rules/live.smk"


# A failed run (a checkpoint that cannot be fetched, loaded or run) still leaves each sweep it was making, from
# the checkpoints that finished, the others listed with status = "unfinished", and none of the weights it fetched
# unless another running Snakemake has locked them (src/anisweep/measures/partial.py; what Snakemake knows is
# gathered in workflow/rules/common.smk).
onerror:
    write_partial_sweeps(unfinished_sweeps())
    remove_fetched_weights(workflow)
    cancel_rescheduling_timers()


# A measure no longer in the config leaves no table or figure behind (anisweep.measures.stale).
onsuccess:
    remove_stale_measure_outputs("results", MODELS, MEASURES)
    cancel_rescheduling_timers()


rule all:
    default_target: True
    input:
        all_outputs(),
        bootstrap_outputs(),
