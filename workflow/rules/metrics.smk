rule metrics:
    input:
        rules.extract.output,
        code=ANALYSIS_CODE["metrics"],
    output:
        "results/{family}/{model}/step{step}/metrics.parquet",
    params:
        extract_dir="results/{family}/{model}/step{step}",
    log:
        "logs/metrics/{family}/{model}/step{step}.log",
    shell:
        "{ANISWEEP} metrics --extract-dir {params.extract_dir} --out {output} 2> {log}" + on_failure()


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules: aggregate


rule aggregate:
    input:
        metrics=model_metrics,
        code=ANALYSIS_CODE["aggregate"],
    output:
        "results/{family}/{model}/sweep.parquet",
    params:
        steps=lambda wc: ",".join(str(c.step) for c in model_checkpoints(wc.family, wc.model)),
        final=lambda wc: anisweep_config.final_step(wc.family, wc.model, [c.step for c in model_checkpoints(wc.family, wc.model)]),
    log:
        "logs/aggregate/{family}/{model}.log",
    shell:
        "{ANISWEEP} aggregate --out {output} --expected-steps {params.steps} --final-step {params.final} "
        "{input.metrics} 2> >(tee {log:q} >&2)"
