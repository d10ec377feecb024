# The evaluation texts are read once, where the network is (a Hugging Face dataset downloads here: on the
# submit host in cluster runs), and every extract reads this file. A change to a `corpus:` key the corpus reads
# (anisweep.media.corpus_settings: a text corpus reads no image or audio key) reruns it. An image or audio corpus
# is stored as the chosen files' bytes (anisweep.media).
from anisweep.media import corpus_settings


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
        corpus=json_arg(corpus_settings(config["corpus"])),
    shell:
        "{params.cli} corpus --corpus {params.corpus} --out {output} 2> {log} {params.on_failure}"
