from anisweep.tables import EXTRACT_FORMAT, EXTRACT_TABLES


# The record of the stream measures' code that extract reads (common.smk, STREAM_MEASURE_RECORD): written here, never
# while the workflow is read; its param is the text it writes.
localrules:
    stream_measure_code,


rule stream_measure_code:
    output:
        STREAM_MEASURE_CODE,
    log:
        "logs/stream_measure_code.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("stream_measure_code"),
        record=STREAM_MEASURE_RECORD,
    shell:
        "printf '%s' {params.record:q} > {output:q} 2> {log:q} {params.on_failure}"


# The one job per checkpoint that holds its weights: the forward pass (extract's tables) and, where the gradient
# analysis covers the checkpoint, the backward pass (its tables), one model load. Every other per-checkpoint
# and per-model step reads their Parquet. update(): a failed or killed rerun leaves the previous tables in place
# (Snakemake restores them), never a checkpoint without tables whose metrics still read ok.
rule extract:
    input:
        weights="weights/{family}/{model}/step{step}",
        texts=rules.corpus.output[0],
        # a stream measure's code runs in the forward pass: editing it reruns extract (docs/measures.md)
        stream_measure_code=stream_measure_code,
    output:
        **{
            name: update(f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet")
            for name in [*EXTRACT_TABLES, *GRADIENT_PASS_TABLES]
        },
        **{
            f"measure_{name}": update(f"results/{{family}}/{{model}}/step{{step}}/measures/{name}.parquet")
            for name in STREAM_MEASURES
        },
        info=update("results/{family}/{model}/step{step}/extract.json"),
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    # Before any further fetch: a fetched checkpoint is extracted (and its weights deleted) first, so that the
    # disk holds the weights of the checkpoints in flight only, not the whole sweep's.
    priority: 1
    conda:
        CONDA_ENV
    threads: config["resources"]["extract_threads"]
    resources:
        gpu=EXTRACT_GPU,
        mem_mb=lambda wildcards, attempt: (2 if covered(wildcards) else 1) * extract_mem_mb(wildcards, attempt),
        runtime=lambda wildcards, attempt: (3 if covered(wildcards) else 1) * extract_runtime(wildcards, attempt),
    params:
        on_failure=on_failure("extract"),
        cli=CLI,
        extract=settings_of(config["extract"], EXTRACT_OUTPUT_KEYS),
        # what the tables hold: a package that writes more reruns the model jobs of results written before it
        tables_format=f"extract tables format {EXTRACT_FORMAT}",
        gradient_pass=gradient_pass_settings,
        source=checkpoint_source,
        settings=untracked(json_arg(config["extract"])),
        gradients=untracked(gradient_pass_arg),
        stream_measures=untracked(
            " ".join(f"--stream-measure {shlex.quote(m.entry)}" for m in STREAM_MEASURES.values())
        ),
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} extract --manifest {input.weights}/checkpoint.json --texts {input.texts} "
        "--settings {params.settings} {params.gradients} {params.stream_measures} --threads {threads} "
        "--out {params.out} 2> {log} {params.on_failure}"
