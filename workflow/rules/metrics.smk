rule metrics:
    input:
        rules.extract.output,
    output:
        "results/{family}/{model}/step{step}/metrics.parquet",
    params:
        extract_dir="results/{family}/{model}/step{step}",
    log:
        "logs/metrics/{family}/{model}/step{step}.log",
    shell:
        "{ANISWEEP} metrics --extract-dir {params.extract_dir} --out {output} 2> {log}"


rule aggregate:
    input:
        model_metrics,
    output:
        "results/{family}/{model}/sweep.parquet",
    params:
        steps=lambda wc: ",".join(str(c.step) for c in model_checkpoints(wc.family, wc.model)),
    log:
        "logs/aggregate/{family}/{model}.log",
    shell:
        "{ANISWEEP} aggregate --out {output} --expected-steps {params.steps} {input} 2> {log}"
