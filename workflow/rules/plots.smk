# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    plot_model,
    plot_family,
    plot_families,


rule plot_model:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        code=ANALYSIS_CODE["plots"],
    output:
        **{
            name.removesuffix(".png"): report(
                f"results/{{family}}/{{model}}/figures/{name}",
                caption=f"../report/{name.removesuffix('.png')}.rst",
                category="{family}",
                subcategory="{model}",
            )
            for name in MODEL_FIGURES
        },
    log:
        "logs/plots/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_model"),
        out_dir="results/{family}/{model}/figures",
    shell:
        "{params.cli} plot --sweep {input.sweep} --out-dir {params.out_dir} 2> {log} {params.on_failure}"


rule plot_family:
    input:
        sweeps=lambda wc: [f"results/{f}/{m}/sweep.parquet" for f, m in MODELS if f == wc.family],
        code=ANALYSIS_CODE["plots"],
    output:
        report(
            "results/{family}/figures/compare.png",
            caption="../report/compare.rst",
            category="{family}",
            subcategory="all models",
        ),
    log:
        "logs/plots/{family}/compare.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_family"),
    shell:
        "{params.cli} plot-family --out {output} {input.sweeps} 2> {log} {params.on_failure}"


rule plot_families:
    input:
        sweeps=[f"results/{f}/{m}/sweep.parquet" for f, m in MODELS],
        code=ANALYSIS_CODE["plot_families"],
    output:
        report(
            "results/figures/compare_families.png",
            caption="../report/compare_families.rst",
            category="families",
        ),
    log:
        "logs/plots/compare_families.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_families"),
    shell:
        "{params.cli} plot-families --out {output} {input.sweeps} 2> {log} {params.on_failure}"
