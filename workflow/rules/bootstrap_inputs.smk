# The bootstrap rules' settings, groups and inputs (workflow/rules/bootstrap.smk).
import re

BOOTSTRAP = config["bootstrap"]
# what changes the tables: the intervals' level, B, the draws' seed and the measures (their order does not: sorted)
BOOTSTRAP_ARGS = (
    f"--level {BOOTSTRAP['level']} --samples {BOOTSTRAP['samples']} --seed {BOOTSTRAP['seed']} "
    f"--measures {' '.join(sorted(BOOTSTRAP['measures']))}"
)


def bootstrap_groups():
    """{group: [(family, model), ...]} of config bootstrap.groups, each model named as its results folder is (or
    family/model), all of one family and sharing a step; a config error names what is wrong."""
    by_name = {}
    for family, model in MODELS:
        by_name.setdefault(model, []).append((family, model))
        by_name[f"{family}/{model}"] = [(family, model)]
    groups = {}
    for group, names in BOOTSTRAP["groups"].items():
        unknown = [name for name in names if len(by_name.get(name, ())) != 1]
        if unknown:
            raise WorkflowError(
                f"config: bootstrap.groups.{group}: {unknown} {'is' if len(unknown) == 1 else 'are'} not one model "
                f"this config sweeps (name each as its results folder is, family/model where two families share a "
                f"name): {sorted(by_name)}"
            )
        members = [by_name[name][0] for name in names]
        if len(members) != len(set(members)):
            raise WorkflowError(f"config: bootstrap.groups.{group}: a model is named twice: {names}")
        families = sorted({family for family, _ in members})
        if len(families) > 1:
            raise WorkflowError(
                f"config: bootstrap.groups.{group}: models of families {families}; a group's seeds are one training "
                "procedure's, read with one tokenizer on one evaluation sample: make a group of each family"
            )
        if not shared_steps(members):
            raise WorkflowError(
                f"config: bootstrap.groups.{group}: {names} share no step; a group is resampled at the steps all "
                "its models have"
            )
        groups[group] = members
    return groups


def shared_steps(members):
    """The steps every one of `members` ((family, model) pairs) is swept at, in order."""
    steps = [{c.step for c in model_checkpoints(family, model)} for family, model in members]
    return sorted(set.intersection(*steps))


BOOTSTRAP_GROUPS = bootstrap_groups() if BOOTSTRAP["enabled"] else {}


def bootstrap_outputs():
    if not BOOTSTRAP["enabled"]:
        return []
    models = [f"results/{family}/{model}/bootstrap.parquet" for family, model in MODELS]
    return models + [f"results/bootstrap/{group}.parquet" for group in BOOTSTRAP_GROUPS]


def group_folders(wildcards):
    """Each of the group's models' checkpoint folders at the steps they share, model by model."""
    members = BOOTSTRAP_GROUPS[wildcards.group]
    steps = shared_steps(members)
    return [[f"results/{family}/{model}/step{step}" for step in steps] for family, model in members]


def checkpoints_args(seeds):
    return " ".join("--checkpoints " + " ".join(shlex.quote(folder) for folder in folders) for folders in seeds)
