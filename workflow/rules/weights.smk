# Weight measures (anisweep.measures.registry's third kind): each checkpoint's own weights read tensor by tensor,
# never a forward pass and never extract's tables, so that adding or editing one reruns its own jobs (and the metrics
# that join its rows), never fetch or extract. A toy's or local run's folder is read in place; a Hub checkpoint's
# weights, in a run that fetches them, in the copy fetch shares with the job (anisweep.weights.fetched: each byte
# moves once), else by range reads of the named tensors (anisweep.weights.remote), never by a fetch of their own.
# (Its constants and input functions: workflow/rules/weights_inputs.smk.)


# The built-in weight measure: each head's W_QK and W_VO read through the vocabulary (anisweep.measures.circuits).
rule weights:
    input:
        toy_checkpoints_dir,
        after_fetch,
        code=WEIGHTS_CODE,
    output:
        metrics="results/{family}/{model}/step{step}/weights.parquet",
        pairs="results/{family}/{model}/step{step}/weight_pairs.parquet",
    log:
        "logs/weights/{family}/{model}/step{step}.log",
    # before a further fetch, as extract: the copy fetch shared with it is removed once it has read it
    priority: 1
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("weights"),
        cli=CLI,
        # what the checkpoint is (a local run saved again, a Hub branch pushed again): recorded, so that it reruns
        source=checkpoint_source,
        probe=config["weights"]["probe_tokens"],
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        fetched=fetched_copy("weights"),
    shell:
        "{params.cli} weights --checkpoint {params.checkpoint} --probe-tokens {params.probe} "
        "--out {output.metrics} --pairs-out {output.pairs} {params.fetched} 2> {log} {params.on_failure}"


# A user's weight measure of one checkpoint: its own job, so that adding or editing one runs it alone.
rule weight_measure:
    input:
        toy_checkpoints_dir,
        after_fetch,
        code=code_inputs("weights.run", commands="cli.weights"),
    output:
        "results/{family}/{model}/step{step}/measures/{measure}.parquet",
    log:
        "logs/measures/{family}/{model}/step{step}.{measure}.log",
    wildcard_constraints:
        measure="|".join(WEIGHT_MEASURES) or "(?!)",
    priority: 1
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("weight_measure"),
        cli=CLI,
        entry=lambda wc: shlex.quote(WEIGHT_MEASURES[wc.measure].entry),
        # its code by content: editing it reruns its jobs, installing the same code elsewhere does not
        code=lambda wc: WEIGHT_MEASURES[wc.measure].code_identity,
        source=checkpoint_source,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        fetched=fetched_copy("measure"),
    shell:
        "{params.cli} weights --entry {params.entry} --checkpoint {params.checkpoint} --out {output} "
        "{params.fetched} 2> {log} {params.on_failure}"


# The logit lens (anisweep.measures.logit_lens): extract's sampled residual states read through the checkpoint's own
# head, against the batch's next tokens (an encoder's: its states at masked tokens, against the token masked). Its
# head's weights are read, never run forward (in a run that fetched them, in the copy fetch shared with it).
rule logit_lens:
    input:
        toy_checkpoints_dir,
        hidden="results/{family}/{model}/step{step}/hidden.parquet",
        masked="results/{family}/{model}/step{step}/masked_resid.parquet",
        info="results/{family}/{model}/step{step}/extract.json",
        texts=rules.corpus.output[0],
        code=code_inputs("weights.lens", commands="cli.weights"),
    output:
        "results/{family}/{model}/step{step}/logit_lens.parquet",
    log:
        "logs/logit_lens/{family}/{model}/step{step}.log",
    priority: 1
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("logit_lens"),
        cli=CLI,
        source=checkpoint_source,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        settings=untracked(json_arg(config["extract"])),
        extract_dir=lambda wildcards, input: os.path.dirname(input.info),
        fetched=fetched_copy("logit_lens"),
    shell:
        "{params.cli} logit-lens --checkpoint {params.checkpoint} --extract-dir {params.extract_dir} "
        "--texts {input.texts} --settings {params.settings} --out {output} {params.fetched} 2> {log} "
        "{params.on_failure}"


# The lens over training: rank and probability of the target, KL to the last layer, the angle of each step.
rule plot_logit_lens:
    input:
        sweep="results/{family}/{model}/sweep.parquet",
        code=code_inputs("plots.circuits", commands="cli.plots"),
    output:
        **model_figures(LENS_FIGURES),
    log:
        "logs/plot_logit_lens/{family}/{model}.log",
    conda:
        CONDA_ENV
    shell:
        figure_command(
            "plot-logit-lens --sweep {input.sweep:q} --out {output.logit_lens:q}", "plot_logit_lens", "family", "model"
        )


# The circuits over training: QK patterns and copying heads forming, per layer and head; the top token pairs of the
# heads that end most self-attending and most copying, at three steps. From the weight tables alone, never a sweep:
# a weights-only sweep draws them too.
rule plot_circuits:
    input:
        weights=per_checkpoint("weights.parquet"),
        pairs=per_checkpoint("weight_pairs.parquet"),
        code=code_inputs("plots.circuits", commands="cli.plots"),
    output:
        **model_figures(BUILTIN_WEIGHT["circuits"]),
    log:
        "logs/plot_circuits/{family}/{model}.log",
    conda:
        CONDA_ENV
    shell:
        figure_command(
            "plot-circuits --weights {input.weights:q} --qk {output.qk_circuits:q} --ov {output.ov_circuits:q} "
            "--pairs-figure {output.circuit_pairs:q} {input.pairs:q}",
            "plot_circuits",
            "family",
            "model",
        )


# A sweep of the weights alone, `snakemake weights_only`: every saved checkpoint's weight measures (the built-in
# circuits and the user's) and the circuit figures, without fetch or any forward pass; a Hub checkpoint's named
# tensors are read by range requests. The logit lens and the sweep tables need extract: the default target.
rule weights_only:
    input:
        weights_only_outputs(),
