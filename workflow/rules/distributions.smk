from anisweep.mechanism.qk_svd import FIGURES as QK_SVD_FIGURES
from anisweep.plots.spectra import SPECTRA_FIGURES


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    qk_svd,
    plot_score_hist,
    plot_spectra,


# Per model, after every checkpoint is extracted: one SVD of the sampled queries and keys of all steps, per head.
rule qk_svd:
    input:
        samples=lambda wc: [f"results/{c.key}/qk_sample.parquet" for c in model_checkpoints(wc.family, wc.model)],
        means=lambda wc: [f"results/{c.key}/qk.parquet" for c in model_checkpoints(wc.family, wc.model)],
        code=ANALYSIS_CODE["qk_svd"],
    output:
        **{
            name.removesuffix(".png"): report(
                f"results/{{family}}/{{model}}/figures/{name}",
                caption=f"../report/{name.removesuffix('.png')}.rst",
                category="{family}",
                subcategory="{model}",
            )
            for name in QK_SVD_FIGURES
        },
        table="results/{family}/{model}/qk_svd.parquet",
    log:
        "logs/qk_svd/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("qk_svd"),
        dirs=lambda wc: " ".join(f"results/{c.key}" for c in model_checkpoints(wc.family, wc.model)),
        figures="results/{family}/{model}/figures",
        fraction=config["qk_svd"]["fraction"],
        seed=config["qk_svd"]["seed"],
        heads=json_arg(config["qk_svd"]["heads"]),
    shell:
        "{params.cli} qk-svd --out {output.table} --figures-dir {params.figures} --fraction {params.fraction} "
        "--seed {params.seed} --heads {params.heads} {params.dirs} 2> {log} {params.on_failure}"


rule plot_score_hist:
    input:
        hists=lambda wc: [f"results/{c.key}/score_hist.parquet" for c in model_checkpoints(wc.family, wc.model)],
        code=ANALYSIS_CODE["score_hist"],
    output:
        report(
            "results/{family}/{model}/figures/score_hist.png",
            caption="../report/score_hist.rst",
            category="{family}",
            subcategory="{model}",
        ),
    log:
        "logs/plots/{family}/{model}.score_hist.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_score_hist"),
    shell:
        "{params.cli} plot-score-hist --out {output} {input.hists} 2> {log} {params.on_failure}"


# Per model: the normalised singular-value spectra of the sampled hidden states and q/k over training.
rule plot_spectra:
    input:
        spectra=lambda wc: [f"results/{c.key}/spectra.parquet" for c in model_checkpoints(wc.family, wc.model)],
        code=ANALYSIS_CODE["spectra"],
    output:
        **{
            name.removesuffix(".png"): report(
                f"results/{{family}}/{{model}}/figures/{name}",
                caption=f"../report/{name.removesuffix('.png')}.rst",
                category="{family}",
                subcategory="{model}",
            )
            for name in SPECTRA_FIGURES
        },
    log:
        "logs/plots/{family}/{model}.spectra.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_spectra"),
    shell:
        "{params.cli} plot-spectra --out {output} {input.spectra} 2> {log} {params.on_failure}"
