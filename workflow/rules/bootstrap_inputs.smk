# The bootstrap rules' settings, groups and inputs (workflow/rules/bootstrap.smk).
import re

from anisweep.measures import sum_bootstrap

BOOTSTRAP = config["bootstrap"]
# what changes the tables: the intervals' level, B, the draws' seed and the measures (their order does not: sorted),
# sink1_eps's epsilon where it is resampled, and SVCCA's variance and the CCA measures' width limit where they are
BOOTSTRAP_ARGS = (
    f"--level {BOOTSTRAP['level']} --samples {BOOTSTRAP['samples']} --seed {BOOTSTRAP['seed']} "
    f"--measures {' '.join(sorted(BOOTSTRAP['measures']))}"
    + (f" --sink-epsilon {config['sinks']['epsilon']}" if "sink1_eps" in BOOTSTRAP["measures"] else "")
    + (f" --svcca-variance {config['compare']['svcca_variance']}" if "svcca" in BOOTSTRAP["measures"] else "")
    + (
        f" --cca-max-width {config['compare']['cca_max_width'] or 0}"
        if {"svcca", "pwcca"} & set(BOOTSTRAP["measures"])
        else ""
    )
)
# what a bootstrap job reads of each checkpoint beside hidden.parquet and extract.json: each resampling unit's sums
# where a measure built of them is resampled, and the sequences' first-key importances for sink1_eps
BOOTSTRAP_SUMS = (["units.parquet"] if set(BOOTSTRAP["measures"]) & set(sum_bootstrap.MEASURES) else []) + (
    ["sinks.parquet"] if "sink1_eps" in BOOTSTRAP["measures"] else []
)


def model_sums(wildcards):
    """The model's checkpoints' BOOTSTRAP_SUMS files."""
    return [path for name in BOOTSTRAP_SUMS for path in per_checkpoint(name)(wildcards)]


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


def bootstrap_comparisons():
    """{comparison: its config entry} of config bootstrap.comparisons: two groups of bootstrap.groups, of one family,
    sharing a step, and for the paired design of as many seeds; a config error names what is wrong."""
    comparisons = {}
    for name, spec in BOOTSTRAP["comparisons"].items():
        where = f"config: bootstrap.comparisons.{name}"
        sides = (spec["base"], spec["other"])
        unknown = [group for group in sides if group not in BOOTSTRAP_GROUPS]
        if unknown:
            raise WorkflowError(
                f"{where}: {unknown} {'is' if len(unknown) == 1 else 'are'} not a group of bootstrap.groups "
                f"({sorted(BOOTSTRAP_GROUPS)}): name two groups defined there"
            )
        if sides[0] == sides[1]:
            raise WorkflowError(f"{where}: base and other are both {sides[0]!r}; compare two groups")
        base, other = (BOOTSTRAP_GROUPS[group] for group in sides)
        families = sorted({family for family, _ in base + other})
        if len(families) > 1:
            raise WorkflowError(
                f"{where}: {sides[0]} and {sides[1]} are of families {families}; the two groups are resampled on "
                "the same evaluation sequences, so they must be models of one family (one tokenizer, one sample)"
            )
        if spec["design"] == "paired" and len(base) != len(other):
            raise WorkflowError(
                f"{where}: the paired design pairs seed i of {sides[0]} with seed i of {sides[1]}, but they have "
                f"{len(base)} and {len(other)} models; give both groups the same number of seeds, in matching "
                "order, or use design: unpaired"
            )
        if not compared_steps(base, other):
            raise WorkflowError(
                f"{where}: {sides[0]} and {sides[1]} share no step; the groups are compared at the steps all their "
                "models have"
            )
        comparisons[name] = spec
    return comparisons


def compared_steps(base, other):
    """The steps every model of both groups is swept at, in order."""
    return sorted(set(shared_steps(base)) & set(shared_steps(other)))


BOOTSTRAP_COMPARISONS = bootstrap_comparisons() if BOOTSTRAP["enabled"] else {}


def bootstrap_outputs():
    if not BOOTSTRAP["enabled"]:
        return []
    models = [f"results/{family}/{model}/bootstrap.parquet" for family, model in MODELS]
    groups = [f"results/bootstrap/{group}.parquet" for group in BOOTSTRAP_GROUPS]
    return models + groups + [f"results/bootstrap/compare/{name}.parquet" for name in BOOTSTRAP_COMPARISONS]


def group_folders(wildcards):
    """Each of the group's models' checkpoint folders at the steps they share, model by model."""
    members = BOOTSTRAP_GROUPS[wildcards.group]
    steps = shared_steps(members)
    return [[f"results/{family}/{model}/step{step}" for step in steps] for family, model in members]


def comparison_folders(wildcards):
    """{"base": ..., "other": ...}: each side's models' checkpoint folders at the steps both groups share."""
    spec = BOOTSTRAP_COMPARISONS[wildcards.comparison]
    base, other = BOOTSTRAP_GROUPS[spec["base"]], BOOTSTRAP_GROUPS[spec["other"]]
    steps = compared_steps(base, other)
    return {
        side: [[f"results/{family}/{model}/step{step}" for step in steps] for family, model in members]
        for side, members in (("base", base), ("other", other))
    }


def comparison_inputs(name):
    """The files of both groups' checkpoints that a comparison reads: hidden.parquet or extract.json."""

    def inputs(wildcards):
        sides = comparison_folders(wildcards).values()
        return [f"{folder}/{name}" for seeds in sides for folders in seeds for folder in folders]

    return inputs


def comparison_args(wildcards):
    """The comparison's groups, design and each side's checkpoint folders, seed by seed, as the command takes them."""
    spec = BOOTSTRAP_COMPARISONS[wildcards.comparison]
    folders = comparison_folders(wildcards)
    return " ".join(
        [
            f"--base-group {shlex.quote(spec['base'])} --other-group {shlex.quote(spec['other'])}",
            f"--design {spec['design']}",
            checkpoints_args(folders["base"], "--base"),
            checkpoints_args(folders["other"], "--other"),
        ]
    )


def checkpoints_args(seeds, flag="--checkpoints"):
    return " ".join(f"{flag} " + " ".join(shlex.quote(folder) for folder in folders) for folders in seeds)
