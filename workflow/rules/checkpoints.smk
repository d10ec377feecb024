# Downloads run on the submit host in cluster runs: compute nodes often have no internet.
localrules:
    fetch,


# Weights live here only until extract has read them (temp), unless fetch.keep_weights keeps them
# in the Hugging Face cache. The checkpoint's config.json and tokenizer are checked against the extract
# settings and the corpus before any weights move (anisweep.checkpoints.preflight).
rule fetch:
    input:
        toy_checkpoints_dir,
        texts=rules.corpus.output[0],
    output:
        temp(directory("weights/{family}/{model}/step{step}")),
    log:
        "logs/fetch/{family}/{model}/step{step}.log",
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("fetch"),
        checkpoint=lambda wc: json_arg(checkpoint_of(wc).to_dict()),
        keep="--keep-weights" if config["fetch"]["keep_weights"] else "",
        retries=config["fetch"]["retries"],
        settings=json_arg(config["extract"]),
    shell:
        "{params.cli} fetch --checkpoint {params.checkpoint} --out {output} {params.keep} "
        "--retries {params.retries} --texts {input.texts} --settings {params.settings} 2> {log} {params.on_failure}"
