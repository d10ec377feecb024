# The evaluation texts are read once, where the network is (a Hugging Face dataset downloads here: on the
# submit host in cluster runs), and every extract reads this file. A change to a `corpus:` key the corpus reads
# (anisweep.media.corpus_settings: a text corpus reads no image or audio key) reruns it. An image or audio corpus
# is stored as the chosen files' bytes (anisweep.media). A local corpus is checked now, as the config is read, so
# that a file the corpus job could not read stops the run before any job (anisweep.corpus_files): by the main
# Snakemake process alone, which runs the corpus job (a local rule), since a cluster job's node need not hold them.
from anisweep.corpus_files import CorpusError, check_local_corpus
from anisweep.media import corpus_settings

if workflow.is_main_process:
    try:
        check_local_corpus(config["corpus"])
    except CorpusError as error:
        raise WorkflowError(f"config: {error}") from None


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
