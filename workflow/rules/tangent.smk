# Tangent-aligned anisotropy (config `gradients`, off unless enabled): extract's job of each covered checkpoint
# runs the backward pass of the model's own LM loss and writes its sums and token sample (anisweep.tangent.
# pass_tables); from them alone, per checkpoint, the gradients at a few residual-stream sites against semi-NMF /
# PCA subspaces of the activations and matched-rank random controls (anisweep.tangent.checkpoint); per model
# one table and two figures. No rule here needs the weights: changing a rank, the controls or the subspaces
# reruns no model.
# With gradients.subspaces fixed | both: per model, semi-NMF / PCA bases fitted once on extract's hidden-state
# samples of the fit window's steps, pooled (anisweep.tangent.fixed), and every covered checkpoint's shares in
# them, one table per model that sweep and gradients_sweep join (a checkpoint's own files depend on it alone).
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
        on_failure=on_failure("gradient_fixed_bases"),
        cli=CLI,
        gradients=gradient_settings_of(FIXED_BASES_KEYS),
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradient-fixed-bases --gradients {params.gradients} --out {output} {input.hidden} "
        "2> {log} {params.on_failure}"


rule gradient_fixed_shares:
    input:
        fixed=rules.gradient_fixed_bases.output[0],
        sums=per_checkpoint("gradient_sums.parquet", gradient_checkpoints),
        code=ANALYSIS_CODE["fixed_shares"],
    output:
        "results/{family}/{model}/gradient_fixed_shares.parquet",
    log:
        "logs/gradient_fixed_shares/{family}/{model}.log",
    conda:
        CONDA_ENV
    threads: config["resources"]["extract_threads"]
    params:
        on_failure=on_failure("gradient_fixed_shares"),
        cli=CLI,
        gradients=gradient_settings_of(FIXED_SHARES_KEYS),
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradient-fixed-shares --fixed-bases {input.fixed} --gradients {params.gradients} "
        "--threads {threads} --out {output} {input.sums} 2> {log} {params.on_failure}"


rule gradients:
    input:
        sums="results/{family}/{model}/step{step}/gradient_sums.parquet",
        sample="results/{family}/{model}/step{step}/gradient_sample.parquet",
        code=ANALYSIS_CODE["gradients"],
    output:
        **GRADIENT_EXTRA_OUTPUTS,
        table="results/{family}/{model}/step{step}/gradients.parquet",
    log:
        "logs/gradients/{family}/{model}/step{step}.log",
    conda:
        CONDA_ENV
    # numpy's BLAS (the subspace fits) keeps to the job's threads: spinning BLAS threads on busy cores cost 15x
    # the CPU time.
    threads: config["resources"]["extract_threads"]
    resources:
        mem_mb=lambda wildcards, input, attempt: int(2000 + 4 * input.size_mb) * attempt,
    params:
        on_failure=on_failure("gradients"),
        cli=CLI,
        gradients=gradient_settings_of(SHARES_KEYS),
        per_checkpoint=GRADIENTS["subspaces"] != "fixed",
        all_settings=untracked(json_arg(GRADIENTS)),
        extra=gradient_extra_args,
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradients --sums {input.sums} --sample {input.sample} --gradients {params.all_settings} "
        "--threads {threads} --out {output.table} {params.extra} 2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    gradient_fixed_bases,
    gradient_fixed_shares,
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
        on_failure=on_failure("gradients_sweep"),
        cli=CLI,
        gradients=gradient_settings_of(SWEEP_KEYS),
        extra=gradient_sweep_args,
    shell:
        "{params.cli} gradients-sweep --out {output} {input.tables} --gradients {params.gradients} {params.extra} "
        "2> {log} {params.on_failure}"
