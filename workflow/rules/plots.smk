from anisweep.plots.phases import PHASES_FIGURES
from anisweep.plots.spectra import SPECTRA_FIGURES
from anisweep.plots.survey import FIGURES as SURVEY_FIGURES


# Seconds of work: on the submit host in cluster runs, not a SLURM job each.
localrules:
    plot_model,
    plot_measure,
    plot_family,
    plot_families,
    plot_survey,
    plot_score_hist,
    plot_spectra,
    plot_phases,
    plot_gradients,
    plot_untrained,
    explore,


rule plot_model:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        bootstrap=model_intervals,
        code=ANALYSIS_CODE["plots"],
    output:
        **model_figures(MODEL_FIGURES),
    log:
        "logs/plots/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        out_dir="results/{family}/{model}/figures",
    shell:
        figure_command(
            "plot --sweep {input.sweep} --out-dir {params.out_dir} --bootstrap {input.bootstrap}",
            "plot_model",
            "family",
            "model",
        )


# A user's measure's figure (its own, or the default: value over training per layer), from the model's sweep.
rule plot_measure:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        code=ANALYSIS_CODE["plot_measure"],
    output:
        report(
            "results/{family}/{model}/figures/measure_{measure}.png",
            caption="../report/measure.rst",
            category="{family}",
            subcategory="{model}",
        ),
    log:
        "logs/plots/{family}/{model}.measure_{measure}.log",
    wildcard_constraints:
        measure="|".join(MEASURES) or "(?!)",
    conda:
        CONDA_ENV
    params:
        entry=lambda wc: shlex.quote(MEASURES[wc.measure].entry),
        code=lambda wc: MEASURES[wc.measure].code_identity,
    shell:
        figure_command(
            "plot-measure --entry {params.entry} --sweep {input.sweep} --out {output}",
            "plot_measure",
            "family",
            "model",
            "measure",
        )


rule plot_family:
    input:
        sweeps=lambda wc: [f"results/{f}/{m}/sweep.parquet" for f, m in MODELS if f == wc.family],
        bootstrap=family_intervals,
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
    shell:
        figure_command(
            "plot-family --out {output} --bootstrap {input.bootstrap} -- {input.sweeps}",
            "plot_family",
            "family",
        )


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
    shell:
        figure_command(
            "plot-families --out {output} {input.sweeps}",
            "plot_families",
        )


# Godey et al. 2024 Section 3 across every model of the config, each at its last analysed step (plots/survey.py).
rule plot_survey:
    input:
        sweeps=[f"results/{f}/{m}/sweep.parquet" for f, m in MODELS],
        code=ANALYSIS_CODE["plot_survey"],
    output:
        **model_figures(SURVEY_FIGURES, folder="results/figures", category="survey (Godey et al. 2024, Section 3)"),
    log:
        "logs/plots/survey.log",
    conda:
        CONDA_ENV
    params:
        groups=json_arg(anisweep_config.groups(config)),
    shell:
        figure_command(
            "plot-survey --out-dir results/figures --groups {params.groups} {input.sweeps}",
            "plot_survey",
        )


# One self-contained HTML page to explore every model's per-layer metrics over training (explore/data.py).
rule explore:
    input:
        sweeps=[f"results/{f}/{m}/sweep.parquet" for f, m in MODELS],
        bootstrap=every_model_intervals(),
        code=ANALYSIS_CODE["explore"],
    output:
        report("results/explore.html", caption="../report/explore.rst", category="explore"),
    log:
        "logs/plots/explore.log",
    conda:
        CONDA_ENV
    shell:
        figure_command("explore --out {output} --bootstrap {input.bootstrap} -- {input.sweeps}", "explore")


rule plot_score_hist:
    input:
        hists=per_checkpoint("score_hist.parquet"),
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
    shell:
        figure_command(
            "plot-score-hist --out {output} {input.hists}",
            "plot_score_hist",
            "family",
            "model",
        )


# Per model: the normalised singular-value spectra of the sampled hidden states and q/k over training.
rule plot_spectra:
    input:
        spectra=per_checkpoint("spectra.parquet"),
        code=ANALYSIS_CODE["spectra"],
    output:
        **model_figures(SPECTRA_FIGURES),
    log:
        "logs/plots/{family}/{model}.spectra.log",
    conda:
        CONDA_ENV
    shell:
        figure_command(
            "plot-spectra --out {output} {input.spectra}",
            "plot_spectra",
            "family",
            "model",
        )


# Per model: RankMe and alpha-ReQ per layer over training, the phases (phases.parquet) shaded.
rule plot_phases:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        phases="results/{family}/{model}/phases.parquet",
        bootstrap=model_intervals,
        code=ANALYSIS_CODE["plot_phases"],
    output:
        **model_figures(PHASES_FIGURES),
    log:
        "logs/plots/{family}/{model}.phases.log",
    conda:
        CONDA_ENV
    shell:
        figure_command(
            "plot-phases --sweep {input.sweep} --phases {input.phases} --out {output} --bootstrap {input.bootstrap}",
            "plot_phases",
            "family",
            "model",
        )


rule plot_gradients:
    input:
        sweep="results/{family}/{model}/gradients_sweep.parquet",
        code=ANALYSIS_CODE["plot_gradients"],
    output:
        **model_figures(gradient_figures(GRADIENTS)),
    log:
        "logs/plots/{family}/{model}.gradients.log",
    conda:
        CONDA_ENV
    params:
        out_dir="results/{family}/{model}/figures",
        figures=" ".join(gradient_figures(GRADIENTS)),
    shell:
        figure_command(
            "plot-gradients --sweep {input.sweep} --out-dir {params.out_dir} --figures {params.figures}",
            "plot_gradients",
            "family",
            "model",
        )


rule plot_untrained:
    input:
        rules.untrained.output.summary,
        rules.untrained.output.histogram,
        code=ANALYSIS_CODE["untrained_plots"],
    output:
        **model_figures(UNTRAINED_FIGURES, folder="results/untrained/figures", category="untrained block"),
    log:
        "logs/plots/untrained.log",
    conda:
        CONDA_ENV
    shell:
        figure_command(
            "plot-untrained --tables-dir results/untrained --out-dir results/untrained/figures",
            "plot_untrained",
        )
