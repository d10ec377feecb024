rule metrics:
    input:
        # extract's own tables, not the backward pass's, which gradients reads
        [f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet" for name in EXTRACT_TABLES],
        info="results/{family}/{model}/step{step}/extract.json",
        code=ANALYSIS_CODE["metrics"],
        gradients=gradient_table_of,
        measures=measure_tables,
    output:
        metrics="results/{family}/{model}/step{step}/metrics.parquet",
        spectra="results/{family}/{model}/step{step}/spectra.parquet",
    log:
        "logs/metrics/{family}/{model}/step{step}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("metrics"),
        cli=CLI,
        extract_dir=lambda wildcards, output: os.path.dirname(output[0]),
        gradients=lambda wildcards, input: f"--gradients {input.gradients}" if input.gradients else "",
        measures=lambda wildcards, input: f"--measure-table {input.measures}" if input.measures else "",
        sink_epsilon=config["sinks"]["epsilon"],
    shell:
        "{params.cli} metrics --extract-dir {params.extract_dir} --out {output.metrics} --spectra-out {output.spectra} "
        "--sink-epsilon {params.sink_epsilon} {params.gradients} {params.measures} 2> {log} {params.on_failure}"


# A user's table measure of one checkpoint, from the extract tables it declares: its own job, so that adding or
# editing one runs it alone (and the metrics that join it), never a model.
rule table_measure:
    input:
        tables=lambda wc: [
            f"results/{wc.family}/{wc.model}/step{wc.step}/{name}.parquet"
            for name in TABLE_MEASURES[wc.measure].tables
        ],
        info="results/{family}/{model}/step{step}/extract.json",
        code=ANALYSIS_CODE["measure"],
    output:
        "results/{family}/{model}/step{step}/measures/{measure}.parquet",
    log:
        "logs/measures/{family}/{model}/step{step}.{measure}.log",
    wildcard_constraints:
        measure="|".join(TABLE_MEASURES) or "(?!)",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("table_measure"),
        cli=CLI,
        entry=lambda wc: shlex.quote(TABLE_MEASURES[wc.measure].entry),
        # its code by content: editing it reruns its jobs, installing the same code elsewhere does not
        code=lambda wc: TABLE_MEASURES[wc.measure].code_identity,
        extract_dir=lambda wildcards, input: os.path.dirname(input.info),
    shell:
        "{params.cli} measure --entry {params.entry} --extract-dir {params.extract_dir} --out {output} "
        "2> {log} {params.on_failure}"


# The glossary of this run: the built-in measures and the user's, every metric, site and column (docs/metrics.md
# plus the user's measures, their docstrings as definitions).
rule glossary:
    input:
        code=ANALYSIS_CODE["glossary"],
    output:
        "results/glossary.md",
    log:
        "logs/glossary.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("glossary"),
        cli=CLI,
        measures=" ".join(f"--measure {shlex.quote(m.entry)}" for m in MEASURES.values()),
        code=sorted(m.code_identity for m in MEASURES.values()),
    shell:
        "{params.cli} glossary {params.measures} --out {output} 2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    sweep,
    phases,
    glossary,


rule sweep:
    input:
        metrics=per_checkpoint("metrics.parquet"),
        fixed_shares=fixed_shares_of,
        code=ANALYSIS_CODE["sweep"],
    output:
        "results/{family}/{model}/sweep.parquet",
    log:
        "logs/sweep/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("sweep"),
        cli=CLI,
        steps=lambda wc: ",".join(str(c.step) for c in model_checkpoints(wc.family, wc.model)),
        final=final_step_of,
        fixed=lambda wildcards, input: f"--gradient-fixed-shares {input.fixed_shares}" if input.fixed_shares else "",
        grid=untracked(grid_arg),
        audit=audit_verdict,
        flagged=audit_flagged,
    shell:
        "{params.cli} sweep --out {output} --expected-steps {params.steps} --final-step {params.final} "
        "{params.fixed} {params.grid} {params.flagged} {input.metrics} 2> {log} {params.on_failure}"


# The phases RankMe and alpha-ReQ trace over a model's steps (Li et al. 2025), from its sweep alone: the rule's
# settings (config `phases`) rerun this and its figure, nothing else.
rule phases:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        code=ANALYSIS_CODE["phases"],
    output:
        "results/{family}/{model}/phases.parquet",
    log:
        "logs/phases/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("phases"),
        cli=CLI,
        settings=settings_of(config["phases"], config["phases"]),
    shell:
        "{params.cli} phases --sweep {input.sweep} --out {output} --settings {params.settings} "
        "2> {log} {params.on_failure}"
