# The evaluation texts are read once, where the network is (a Hugging Face dataset downloads here: on the
# submit host in cluster runs), and every extract reads this file. A change to `corpus:` reruns it.
localrules:
    corpus,


rule corpus:
    output:
        "resources/corpus.parquet",
    log:
        "logs/corpus.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("corpus"),
        cli=CLI,
        corpus=json_arg(config["corpus"]),
    shell:
        "{params.cli} corpus --corpus {params.corpus} --out {output} 2> {log} {params.on_failure}"
