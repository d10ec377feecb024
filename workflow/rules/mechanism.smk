from anisweep.mechanism.qk_svd import FIGURES as QK_SVD_FIGURES


# The untrained block with an injected common bias (Godey et al. 2024, Section 4.1): no checkpoint, no corpus.
# Seconds to minutes of CPU: on the submit host in cluster runs, not a SLURM job.
localrules:
    untrained,
    qk_svd,


# A swept model's init (untrained.inits: {model: ...}) reads its checkpoint's weights, fetched for it alone
# (rule fetch_init): the model runs of the sweep and this block never rerun each other.
UNTRAINED_CHECKPOINT_INITS = [i for i in UNTRAINED_INITS if untrained_inits.is_checkpoint_init(i)]


rule untrained:
    input:
        weights=[f"weights/untrained/{untrained_inits.weights_key(i)}" for i in UNTRAINED_CHECKPOINT_INITS],
        code=ANALYSIS_CODE["untrained"],
    output:
        **{name: f"results/untrained/{name}.parquet" for name in UNTRAINED_TABLES},
    log:
        "logs/untrained/untrained.log",
    # one core, as soon as its inputs are there (beside the second toy's training): at two cores it waited for
    # both to be free, at the very end of the sweep
    priority: 50
    conda:
        CONDA_ENV
    threads: 1
    params:
        on_failure=on_failure("untrained"),
        cli=CLI,
        settings=settings_of({**config["untrained"], "inits": UNTRAINED_INITS}, list(config["untrained"])),
        weights=" ".join(
            shlex.quote(f"--weights={untrained_inits.label(i)}=weights/untrained/{untrained_inits.weights_key(i)}")
            for i in UNTRAINED_CHECKPOINT_INITS
        ),
    shell:
        "{params.cli} untrained --settings {params.settings} --out-dir results/untrained --threads {threads} "
        "{params.weights} 2> {log} {params.on_failure}"


# Per model, after every checkpoint is extracted: one SVD of the sampled queries and keys of all steps, per head.
rule qk_svd:
    input:
        samples=per_checkpoint("qk_sample.parquet"),
        means=per_checkpoint("qk.parquet"),
        code=ANALYSIS_CODE["qk_svd"],
    output:
        **model_figures(QK_SVD_FIGURES),
        table="results/{family}/{model}/qk_svd.parquet",
    log:
        "logs/qk_svd/{family}/{model}.log",
    conda:
        CONDA_ENV
    params:
        dirs=lambda wc: " ".join(f"results/{c.key}" for c in model_checkpoints(wc.family, wc.model)),
        figures="results/{family}/{model}/figures",
        fraction=config["qk_svd"]["fraction"],
        seed=config["qk_svd"]["seed"],
        heads=json_arg(config["qk_svd"]["heads"]),
    shell:
        figure_command(
            "qk-svd --out {output.table} --figures-dir {params.figures} --fraction {params.fraction} "
            "--seed {params.seed} --heads {params.heads} {params.dirs}",
            "qk_svd",
            "family",
            "model",
        )
