# Comparative measures (anisweep.measures.compare): a pair of checkpoints compared per layer and site on their shared
# sample of tokens, from their hidden.parquet alone (never a model). One job per pair, so that a new checkpoint runs
# only the pairs it enters (and its successor's `previous` pair), and a pair reruns when either checkpoint's tables
# change; a model's pairs are gathered in results/{family}/{model}/compare.parquet, which the figures read.
# (Its constants and input functions: workflow/rules/compare_inputs.smk.)


rule compare_pair:
    input:
        compare_inputs,
        code=code_inputs("measures.compare", commands="cli.measures"),
    output:
        "results/{family}/{model}/step{step}/compare/{ref_model}.step{ref_step}.parquet",
    log:
        "logs/compare/{family}/{model}/step{step}.{ref_model}.step{ref_step}.log",
    wildcard_constraints:
        ref_step="[0-9]+",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("compare_pair"),
        cli=CLI,
        settings=COMPARE_SETTINGS,
        measures=" ".join(f"--measure {shlex.quote(m.entry)}" for m in COMPARE_MEASURES.values()),
        # the user's comparative measures' code by content: editing one reruns the pairs
        code=sorted(m.code_identity for m in COMPARE_MEASURES.values()),
        extract_dir=lambda wildcards, input: os.path.dirname(input[1]),
        ref_dir=lambda wildcards, input: os.path.dirname(input[3]),
    shell:
        "{params.cli} compare --extract-dir {params.extract_dir} --ref-dir {params.ref_dir} "
        "--settings {params.settings} {params.measures} --out {output} 2> {log} {params.on_failure}"


rule compare_layers:
    input:
        hidden="results/{family}/{model}/step{step}/hidden.parquet",
        info="results/{family}/{model}/step{step}/extract.json",
        code=code_inputs("measures.compare", commands="cli.measures"),
    output:
        "results/{family}/{model}/step{step}/compare/layers.parquet",
    log:
        "logs/compare/{family}/{model}/step{step}.layers.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("compare_layers"),
        cli=CLI,
        settings=settings_of(COMPARE, ("sites",)),  # the layer matrix is linear CKA alone
        extract_dir=lambda wildcards, input: os.path.dirname(input.info),
    shell:
        "{params.cli} compare --layers --extract-dir {params.extract_dir} --settings {params.settings} "
        "--out {output} 2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    compare_sweep,
    plot_compare,
    plot_compare_seeds,


rule compare_sweep:
    input:
        pairs=lambda wc: sorted({path for _, path in model_roles(wc)}),
        code=code_inputs("measures.compare", commands="cli.measures"),
    output:
        "results/{family}/{model}/compare.parquet",
    log:
        "logs/compare/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("compare_sweep"),
        cli=CLI,
        # each pair's role: changing `against` or `seeds` re-gathers the table
        pairs=lambda wc: " ".join(f"{role}={shlex.quote(path)}" for role, path in model_roles(wc)),
    shell:
        "{params.cli} compare-sweep --out {output} {params.pairs} 2> {log} {params.on_failure}"


rule plot_compare:
    input:
        table="results/{family}/{model}/compare.parquet",
        bootstrap=pair_intervals,
        code=code_inputs("plots.compare", commands="cli.plots"),
    output:
        **model_figures(COMPARE_FIGURES),
    log:
        "logs/plots/{family}/{model}.compare.log",
    conda:
        CONDA_ENV
    params:
        out_dir="results/{family}/{model}/figures",
    shell:
        figure_command(
            "plot-compare --table {input.table} --out-dir {params.out_dir} --bootstrap {input.bootstrap}",
            "plot_compare",
            "family",
            "model",
        )


# Only a model with seed pairs (config compare.seeds) asks for it (compare_outputs).
rule plot_compare_seeds:
    input:
        table="results/{family}/{model}/compare.parquet",
        code=code_inputs("plots.compare", commands="cli.plots"),
    output:
        **model_figures(SEED_FIGURES),
    log:
        "logs/plots/{family}/{model}.compare_seeds.log",
    conda:
        CONDA_ENV
    params:
        out_dir="results/{family}/{model}/figures",
    shell:
        figure_command(
            "plot-compare --seeds --table {input.table} --out-dir {params.out_dir}",
            "plot_compare_seeds",
            "family",
            "model",
        )
