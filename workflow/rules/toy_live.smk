import re

from anisweep.checkpoints.local import extract_names
from anisweep.tables import EXTRACT_TABLES

# A live toy (`toy.<name>.live`) is analysed while it trains, no checkpoint saved: train_toy_live writes every
# step's tables into results/toy/{model}/live/step{N}/, and extract_live / gradients_live copy step N's where
# extract and gradients put a saved checkpoint's (they win over those two for live toys alone, so no weights are
# fetched), for metrics, sweep and figures to read as ever.
LIVE_TOYS = [name for family, name in MODELS if family == "toy" and config["toy"][name]["live"]]
LIVE_TOY = "|".join(re.escape(name) for name in LIVE_TOYS) or "(?!)"  # (?!): no model at all


localrules:
    train_toy_live,
    extract_live,
    gradients_live,


ruleorder: extract_live > extract
ruleorder: gradients_live > gradients


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
        cli=ANISWEEP,
        on_failure=on_failure("train_toy_live"),
        spec=lambda wc: json_arg(anisweep_config.toy_spec(config, wc.model)),
        settings=json_arg(config["extract"]),
        gradients=json_arg(GRADIENTS),
    shell:
        "{params.cli} train-toy --spec {params.spec} --out {output} --threads {threads} --name {wildcards.model} "
        "--texts {input.texts} --settings {params.settings} --gradients {params.gradients} "
        "2> {log} {params.on_failure}"


rule extract_live:
    input:
        "results/{family}/{model}/live",
    output:
        **{name: f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet" for name in EXTRACT_TABLES},
        info="results/{family}/{model}/step{step}/extract.json",
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="toy",
        model=LIVE_TOY,
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("extract_live"),
        names=",".join(extract_names()),
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live --live {input} --step {wildcards.step} --names {params.names} --out {params.out} "
        "2> {log} {params.on_failure}"


rule gradients_live:
    input:
        "results/{family}/{model}/live",
    output:
        "results/{family}/{model}/step{step}/gradients.parquet",
    log:
        "logs/gradients/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="toy",
        model=LIVE_TOY,
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradients_live"),
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live --live {input} --step {wildcards.step} --names gradients.parquet "
        "--out {params.out} 2> {log} {params.on_failure}"
