rule plot_model:
    input:
        "results/{family}/{model}/sweep.parquet",
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
    params:
        out_dir="results/{family}/{model}/figures",
    log:
        "logs/plots/{family}/{model}.log",
    shell:
        "{ANISWEEP} plot --sweep {input} --out-dir {params.out_dir} 2> {log}"


rule compare_family:
    input:
        lambda wc: [f"results/{f}/{m}/sweep.parquet" for f, m in MODELS if f == wc.family],
    output:
        report(
            "results/{family}/figures/compare.png",
            caption="../report/compare.rst",
            category="{family}",
            subcategory="all models",
        ),
    log:
        "logs/plots/{family}/compare.log",
    shell:
        "{ANISWEEP} compare --out {output} {input} 2> {log}"
