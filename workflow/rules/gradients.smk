# Tangent-aligned anisotropy (config `gradients`, off unless enabled): per checkpoint a backward pass of the
# model's own LM loss, its gradients at a few residual-stream sites against semi-NMF / PCA subspaces of the
# activations and matched-rank random controls (anisweep.gradients); per model one table and two figures.
rule gradients:
    input:
        weights="weights/{family}/{model}/step{step}",
        texts=rules.corpus.output[0],
    output:
        "results/{family}/{model}/step{step}/gradients.parquet",
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
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "{params.cli} gradients --manifest {input.weights}/checkpoint.json --texts {input.texts} "
        "--settings {params.settings} --gradients {params.gradients} --threads {threads} --out {output} "
        "2> {log} {params.on_failure}"


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    gradients_sweep,
    plot_gradients,


rule gradients_sweep:
    input:
        tables=lambda wc: [f"results/{c.key}/gradients.parquet" for c in gradient_checkpoints(wc.family, wc.model)],
        code=package_files("gradient_plots"),
    output:
        "results/{family}/{model}/gradients_sweep.parquet",
    log:
        "logs/gradients_sweep/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradients_sweep"),
    shell:
        "{params.cli} gradients-sweep --out {output} {input.tables} 2> {log} {params.on_failure}"


rule plot_gradients:
    input:
        sweep="results/{family}/{model}/gradients_sweep.parquet",
        code=package_files("gradient_plots", "plots"),
    output:
        **{
            name.removesuffix(".png"): report(
                f"results/{{family}}/{{model}}/figures/{name}",
                caption=f"../report/{name.removesuffix('.png')}.rst",
                category="{family}",
                subcategory="{model}",
            )
            for name in GRADIENT_FIGURES
        },
    log:
        "logs/plots/{family}/{model}.gradients.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_gradients"),
        out_dir="results/{family}/{model}/figures",
    shell:
        "{params.cli} plot-gradients --sweep {input.sweep} --out-dir {params.out_dir} 2> {log} {params.on_failure}"
