rule metrics:
    input:
        rules.extract.output,
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
        cli=ANISWEEP,
        on_failure=on_failure("metrics"),
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
        code=ANALYSIS_CODE["sweep"],
    output:
        "results/{family}/{model}/sweep.parquet",
    log:
        "logs/sweep/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("sweep"),
        steps=lambda wc: ",".join(str(c.step) for c in model_checkpoints(wc.family, wc.model)),
        final=final_step_of,
    shell:
        "{params.cli} sweep --out {output} --expected-steps {params.steps} --final-step {params.final} "
        "{input.metrics} 2> {log} {params.on_failure}"
