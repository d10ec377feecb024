# The Multi-Bootstrap (anisweep.measures.sample_bootstrap; docs/measures.md) of the sampled vectors' measures and of
# those built of sums: from hidden.parquet, extract.json and units.parquet (sinks.parquet for sink1_eps), never a model;
# the estimates from metrics.parquet. One job per model (its example-level intervals and step tests)
# and one per group of seeds (config bootstrap.groups, at the steps its models share), and one per comparison of two
# groups (config bootstrap.comparisons, at the steps both share), so that a new checkpoint reruns its model's job and
# those of the groups and comparisons it enters, nothing else.


rule bootstrap_model:
    input:
        hidden=per_checkpoint("hidden.parquet"),
        info=per_checkpoint("extract.json"),
        metrics=per_checkpoint("metrics.parquet"),
        sums=model_sums,
        code=code_inputs("measures.sample_bootstrap", commands="cli.bootstrap"),
    output:
        "results/{family}/{model}/bootstrap.parquet",
    log:
        "logs/bootstrap/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("bootstrap_model"),
        cli=CLI,
        settings=BOOTSTRAP_ARGS,
        checkpoints=lambda wildcards, input: checkpoints_args([[os.path.dirname(path) for path in input.info]]),
    shell:
        "{params.cli} bootstrap {params.checkpoints} {params.settings} --out {output} 2> {log} {params.on_failure}"


rule bootstrap_group:
    input:
        hidden=lambda wc: [f"{folder}/hidden.parquet" for seed in group_folders(wc) for folder in seed],
        info=lambda wc: [f"{folder}/extract.json" for seed in group_folders(wc) for folder in seed],
        metrics=lambda wc: [f"{folder}/metrics.parquet" for seed in group_folders(wc) for folder in seed],
        sums=lambda wc: [f"{folder}/{name}" for name in BOOTSTRAP_SUMS for seed in group_folders(wc) for folder in seed],
        code=code_inputs("measures.sample_bootstrap", commands="cli.bootstrap"),
    output:
        "results/bootstrap/{group}.parquet",
    log:
        "logs/bootstrap/{group}.log",
    wildcard_constraints:
        group="|".join(re.escape(group) for group in BOOTSTRAP_GROUPS) or "(?!)",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("bootstrap_group"),
        cli=CLI,
        settings=BOOTSTRAP_ARGS,
        # the models, in order (the seeds' positions in the draws), and the steps they share
        checkpoints=lambda wc: checkpoints_args(group_folders(wc)),
    shell:
        "{params.cli} bootstrap --group {wildcards.group} {params.checkpoints} {params.settings} --out {output} "
        "2> {log} {params.on_failure}"


rule bootstrap_compare:
    input:
        hidden=comparison_inputs("hidden.parquet"),
        info=comparison_inputs("extract.json"),
        metrics=comparison_inputs("metrics.parquet"),
        sums=lambda wc: [path for name in BOOTSTRAP_SUMS for path in comparison_inputs(name)(wc)],
        code=code_inputs("measures.group_bootstrap", commands="cli.bootstrap"),
    output:
        "results/bootstrap/compare/{comparison}.parquet",
    log:
        "logs/bootstrap/compare/{comparison}.log",
    wildcard_constraints:
        comparison="|".join(re.escape(name) for name in BOOTSTRAP_COMPARISONS) or "(?!)",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("bootstrap_compare"),
        cli=CLI,
        settings=BOOTSTRAP_ARGS,
        # the groups, the design, and each side's models in order (paired: seed i with seed i) at the shared steps
        sides=comparison_args,
    shell:
        "{params.cli} bootstrap-compare --name {wildcards.comparison} {params.sides} {params.settings} "
        "--out {output} 2> {log} {params.on_failure}"
