# The untrained block with an injected common bias (Godey et al. 2024, Section 4.1): no checkpoint, no corpus.
# Seconds to minutes of CPU: on the submit host in cluster runs, not a SLURM job.
localrules:
    untrained,
    plot_untrained,


# A swept model's init (untrained.inits: {model: ...}) reads its checkpoint's fetched weights: the rule is one of
# their consumers, so that they are kept (temp) until it has run.
UNTRAINED_CHECKPOINT_INITS = [i for i in UNTRAINED_INITS if untrained_inits.is_checkpoint_init(i)]


rule untrained:
    input:
        weights=[f"weights/{untrained_inits.weights_key(i)}" for i in UNTRAINED_CHECKPOINT_INITS],
        code=ANALYSIS_CODE["untrained"],
    output:
        **{name: f"results/untrained/{name}.parquet" for name in UNTRAINED_TABLES},
    log:
        "logs/untrained/untrained.log",
    conda:
        CONDA_ENV
    threads: 2
    params:
        cli=ANISWEEP,
        on_failure=on_failure("untrained"),
        settings=json_arg({**config["untrained"], "inits": UNTRAINED_INITS}),
        weights=" ".join(
            shlex.quote(f"--weights={untrained_inits.label(i)}=weights/{untrained_inits.weights_key(i)}")
            for i in UNTRAINED_CHECKPOINT_INITS
        ),
    shell:
        "{params.cli} untrained --settings {params.settings} --out-dir results/untrained --threads {threads} "
        "{params.weights} 2> {log} {params.on_failure}"


rule plot_untrained:
    input:
        rules.untrained.output.summary,
        rules.untrained.output.histogram,
        code=ANALYSIS_CODE["untrained_plots"],
    output:
        **{
            name.removesuffix(".png"): report(
                f"results/untrained/figures/{name}",
                caption=f"../report/{name.removesuffix('.png')}.rst",
                category="untrained block",
            )
            for name in UNTRAINED_FIGURES
        },
    log:
        "logs/plots/untrained.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("plot_untrained"),
    shell:
        "{params.cli} plot-untrained --tables-dir results/untrained --out-dir results/untrained/figures "
        "2> {log} {params.on_failure}"
