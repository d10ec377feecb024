import re

from anisweep.tables import EXTRACT_TABLES

# A live toy (`toy.<name>.live`) is analysed while it trains, no checkpoint saved: train_toy_live writes every
# step's tables into results/toy/{model}/live/step{N}/, and extract_live copies step N's where extract puts a saved
# checkpoint's (it wins over extract for live toys alone, so no weights are fetched), for the gradient shares,
# metrics, sweep and figures to read as ever (the take functions: workflow/rules/live_inputs.smk).
LIVE_TOYS = [name for family, name in MODELS if family == "toy" and config["toy"][name]["live"]]
LIVE_TOY = "|".join(re.escape(name) for name in LIVE_TOYS) or "(?!)"  # (?!): no model at all


localrules:
    train_toy_live,
    extract_live,


ruleorder: extract_live > extract


rule train_toy_live:
    input:
        texts=rules.corpus.output[0],
    output:
        directory("results/toy/{model}/live"),
    log:
        "logs/train_toy/{model}.log",
    wildcard_constraints:
        model=LIVE_TOY,
    conda:
        CONDA_ENV
    threads: 1
    params:
        on_failure=on_failure("train_toy_live"),
        cli=CLI,
        spec=lambda wc: json_arg(anisweep_config.toy_spec(config, wc.model)),
        extract=settings_of(config["extract"], EXTRACT_OUTPUT_KEYS),
        gradient_pass=gradient_settings_of([*PASS_KEYS, "enabled", "steps"]),
        settings=untracked(json_arg(config["extract"])),
        gradients=untracked(json_arg(GRADIENTS)),
    shell:
        "{params.cli} train-toy --spec {params.spec} --out {output} --threads {threads} --name {wildcards.model} "
        "--texts {input.texts} --settings {params.settings} --gradients {params.gradients} "
        "2> {log} {params.on_failure}"


rule extract_live:
    input:
        "results/{family}/{model}/live",
    output:
        **{
            name: f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet"
            for name in [*EXTRACT_TABLES, *GRADIENT_PASS_TABLES]
        },
        info="results/{family}/{model}/step{step}/extract.json",
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="toy",
        model=LIVE_TOY,
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("extract_live"),
        cli=CLI,
        names=live_names,
        empty=live_empty,
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live --live {input} --step {wildcards.step} --names {params.names} {params.empty} "
        "--out {params.out} 2> {log} {params.on_failure}"


# A local run analysed while it trained (`models: [{family: local, name, live: true}]`): anisweep.live's
# AnisweepCallback wrote each analysed step's extract tables (and the backward pass's) into {path}/step{N}/, by
# default results/local/{name}/step{N}/, where extract puts a checkpoint's. extract_live_local wins over extract
# for these runs alone: it has no weights input, so with the files in
# place (the config checks that every chosen step has them) they never run; a `path` elsewhere is copied in, and
# a file missing at run time fails with the step to analyse again. update(): forced to run (--forceall), Snakemake
# keeps the callback's files instead of deleting them first, and the in-place check passes. Its recorded `content`
# (the files' sizes and times) takes a step the callback wrote again anew.
LIVE_LOCAL_RUNS = anisweep_config.live_local_runs(config)
LIVE_LOCAL = "|".join(re.escape(name) for name in LIVE_LOCAL_RUNS) or "(?!)"  # (?!): no model at all


localrules:
    extract_live_local,


ruleorder: extract_live_local > extract


rule extract_live_local:
    output:
        **{
            name: update(f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet")
            for name in [*EXTRACT_TABLES, *GRADIENT_PASS_TABLES]
        },
        info=update("results/{family}/{model}/step{step}/extract.json"),
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="local",
        model=LIVE_LOCAL,
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("extract_live_local"),
        cli=CLI,
        source=lambda wc: shlex.quote(str(LIVE_LOCAL_RUNS[wc.model])),
        content=live_local_content,
        names=live_names,
        empty=live_empty,
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live-local --name {wildcards.model} --source {params.source} --step {wildcards.step} "
        "--names {params.names} {params.empty} --out {params.out} 2> {log} {params.on_failure}"
