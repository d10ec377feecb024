# A toy trains in under a minute on one thread: on the submit host in cluster runs, not a SLURM job.
localrules:
    train_toy,


rule train_toy:
    output:
        directory(f"{anisweep_config.TOY_ROOT}/{{model}}"),
    log:
        "logs/train_toy/{model}.log",
    # every checkpoint waits for its toy: the toys start first, side by side
    priority: 100
    conda:
        CONDA_ENV
    threads: 1
    params:
        on_failure=on_failure("train_toy"),
        cli=CLI,
        spec=lambda wc: json_arg(anisweep_config.toy_spec(config, wc.model)),
    shell:
        "{params.cli} train-toy --spec {params.spec} --out {output} --threads {threads} 2> {log} {params.on_failure}"
