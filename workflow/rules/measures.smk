rule metrics:
    input:
        # extract's own tables, not the backward pass's, which gradients reads
        [f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet" for name in EXTRACT_TABLES],
        info="results/{family}/{model}/step{step}/extract.json",
        code=ANALYSIS_CODE["metrics"],
        gradients=gradient_table_of,
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
    shell:
        "{params.cli} metrics --extract-dir {params.extract_dir} --out {output.metrics} --spectra-out {output.spectra} "
        "{params.gradients} 2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    sweep,


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
    shell:
        "{params.cli} sweep --out {output} --expected-steps {params.steps} --final-step {params.final} "
        "{params.fixed} {input.metrics} 2> {log} {params.on_failure}"
