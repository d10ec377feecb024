# The Multi-Bootstrap's tables whose intervals a figure draws as bands (anisweep.plots.intervals): inputs only where
# config bootstrap.enabled is true (workflow/rules/bootstrap_inputs.smk), so that a figure without them is as before.
def model_intervals(wildcards):
    if not BOOTSTRAP["enabled"]:
        return []
    return [f"results/{wildcards.family}/{wildcards.model}/bootstrap.parquet"]


def family_intervals(wildcards):
    """The family's models' tables and those of its groups of seeds."""
    if not BOOTSTRAP["enabled"]:
        return []
    models = [f"results/{f}/{m}/bootstrap.parquet" for f, m in MODELS if f == wildcards.family]
    groups = [g for g, members in BOOTSTRAP_GROUPS.items() if members[0][0] == wildcards.family]
    return models + [f"results/bootstrap/{group}.parquet" for group in groups]


def every_model_intervals():
    if not BOOTSTRAP["enabled"]:
        return []
    return [f"results/{f}/{m}/bootstrap.parquet" for f, m in MODELS]
