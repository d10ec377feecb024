# Tangent-aligned anisotropy (config `gradients`, off unless enabled): per checkpoint a backward pass of the
# model's own LM loss, its gradients at a few residual-stream sites against semi-NMF / PCA subspaces of the
# activations and matched-rank random controls (anisweep.tangent); per model one table and two figures.
# With gradients.subspaces fixed | both: per model, semi-NMF / PCA bases fitted once on extract's hidden-state
# samples of the fit window's steps, pooled (anisweep.tangent.fixed), read by every gradients job.
rule gradient_fixed_bases:
    input:
        hidden=per_checkpoint("hidden.parquet", fixed_window_checkpoints),
        code=ANALYSIS_CODE["fixed_bases"],
    output:
        "results/{family}/{model}/gradient_fixed_bases.parquet",
    log:
        "logs/gradient_fixed_bases/{family}/{model}.log",
    conda:
        CONDA_ENV
    threads: config["resources"]["extract_threads"]
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradient_fixed_bases"),
        gradients=json_arg(GRADIENTS),
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradient-fixed-bases --gradients {params.gradients} --out {output} {input.hidden} "
        "2> {log} {params.on_failure}"


rule gradients:
    input:
        unpack(gradient_inputs),
        weights="weights/{family}/{model}/step{step}",
        texts=rules.corpus.output[0],
    output:
        **GRADIENT_EXTRA_OUTPUTS,
        table="results/{family}/{model}/step{step}/gradients.parquet",
    log:
        "logs/gradients/{family}/{model}/step{step}.log",
    # Like extract, before any further fetch: the weights are deleted once both have read them. numpy's BLAS
    # (the subspace fits) keeps to the job's threads: spinning BLAS threads on busy cores cost 15x the CPU time.
    priority: 1
    conda:
        CONDA_ENV
    threads: config["resources"]["extract_threads"]
    resources:
        gpu=EXTRACT_GPU,
        mem_mb=lambda wildcards, attempt: 2 * extract_mem_mb(wildcards, attempt),
        runtime=lambda wildcards, attempt: 2 * extract_runtime(wildcards, attempt),
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradients"),
        settings=json_arg(config["extract"]),
        gradients=json_arg(GRADIENTS),
        extra=gradient_extra_args,
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradients --manifest {input.weights}/checkpoint.json --texts {input.texts} "
        "--settings {params.settings} --gradients {params.gradients} --threads {threads} --out {output.table} "
        "{params.extra} 2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    gradient_fixed_bases,
    gradients_sweep,


rule gradients_sweep:
    input:
        unpack(gradient_sweep_inputs),
        code=ANALYSIS_CODE["gradients_sweep"],
    output:
        "results/{family}/{model}/gradients_sweep.parquet",
    log:
        "logs/gradients_sweep/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradients_sweep"),
        gradients=json_arg(GRADIENTS),
        extra=gradient_sweep_args,
    shell:
        "{params.cli} gradients-sweep --out {output} {input.tables} --gradients {params.gradients} {params.extra} "
        "2> {log} {params.on_failure}"
