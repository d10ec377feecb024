# Downloads run on the submit host in cluster runs: compute nodes often have no internet.
localrules:
    fetch,
    fetch_init,


# Weights live here only until extract has read them (temp), unless fetch.keep_weights keeps them
# in the Hugging Face cache. The checkpoint's config.json and tokenizer are checked against the extract
# settings and the corpus before any weights move (anisweep.checkpoints.preflight). Its params are untracked:
# a fetch reruns when extract needs the weights again, and a change to what a checkpoint is (its identity, its
# folder's content) is extract's recorded `source` param, so that a fetch never reruns the model runs itself.
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
        on_failure=on_failure("fetch"),
        cli=CLI,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        keep=untracked("--keep-weights" if config["fetch"]["keep_weights"] else ""),
        retries=untracked(config["fetch"]["retries"]),
        settings=untracked(json_arg(config["extract"])),
        audited=untracked(audited_sha256),
        share=untracked(SharedCopies),
    shell:
        "{params.cli} fetch --checkpoint {params.checkpoint} --out {output} {params.keep} "
        "--retries {params.retries} --texts {input.texts} --settings {params.settings} "
        "--audited-sha256 {params.audited} {params.share} 2> {log} {params.on_failure}"


# The untrained block's swept-model inits (untrained.inits: {model: ...}) get their own copy of the weights: were
# it a consumer of extract's, a change to either would rerun the other's model runs (Snakemake reruns every
# consumer of a file it makes again). A Hub init is downloaded twice without fetch.keep_weights.
use rule fetch as fetch_init with:
    output:
        temp(directory("weights/untrained/{family}/{model}/step{step}")),
    log:
        "logs/fetch_init/{family}/{model}/step{step}.log",
    params:
        on_failure=on_failure("fetch_init"),
        cli=CLI,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        keep=untracked("--keep-weights" if config["fetch"]["keep_weights"] else ""),
        retries=untracked(config["fetch"]["retries"]),
        settings=untracked(json_arg(config["extract"])),
        audited=untracked(audited_sha256),
        share="",
