import re

from anisweep.checkpoints.local import extract_names

# A local run analysed while it trained (`models: [{family: local, name, live: true}]`): anisweep.live's
# AnisweepCallback wrote each analysed step's extract tables (and gradients.parquet) into {path}/step{N}/, by
# default results/local/{name}/step{N}/, where extract and gradients put a checkpoint's. extract_live_local and
# gradients_live_local win over those two for these runs alone: they have no weights input, so with the files in
# place (the config checks that every chosen step has them) they never run; a `path` elsewhere is copied in, and
# a file missing at run time fails with the step to analyse again. update(): forced to run (--forceall), Snakemake
# keeps the callback's files instead of deleting them first, and the in-place check passes.
LIVE_LOCAL_RUNS = anisweep_config.live_local_runs(config)
LIVE_LOCAL = "|".join(re.escape(name) for name in LIVE_LOCAL_RUNS) or "(?!)"  # (?!): no model at all


localrules:
    extract_live_local,
    gradients_live_local,


ruleorder: extract_live_local > extract
ruleorder: gradients_live_local > gradients


rule extract_live_local:
    output:
        **{name: update(f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet") for name in EXTRACT_TABLES},
        info=update("results/{family}/{model}/step{step}/extract.json"),
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="local",
        model=LIVE_LOCAL,
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("extract_live_local"),
        source=lambda wc: shlex.quote(str(LIVE_LOCAL_RUNS[wc.model])),
        names=",".join(extract_names()),
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live-local --name {wildcards.model} --source {params.source} --step {wildcards.step} "
        "--names {params.names} --out {params.out} 2> {log} {params.on_failure}"


rule gradients_live_local:
    output:
        update("results/{family}/{model}/step{step}/gradients.parquet"),
    log:
        "logs/gradients/{family}/{model}/step{step}.log",
    wildcard_constraints:
        family="local",
        model=LIVE_LOCAL,
    conda:
        CONDA_ENV
    params:
        cli=ANISWEEP,
        on_failure=on_failure("gradients_live_local"),
        source=lambda wc: shlex.quote(str(LIVE_LOCAL_RUNS[wc.model])),
        out="results/{family}/{model}/step{step}",
    shell:
        "{params.cli} take-live-local --name {wildcards.model} --source {params.source} --step {wildcards.step} "
        "--names gradients.parquet --out {params.out} 2> {log} {params.on_failure}"
