import re

EXTRACT_TABLES = ("qk", "attention", "hidden", "hidden_stats", "layernorm", "embeddings")

# Resources for cluster runs (profiles/slurm, docs/slurm.md): a GPU only when the config asks for cuda, memory
# and wall time from the model's size, so that one profile fits pythia-14m and pythia-12b. Retries double both.
EXTRACT_GPU = 1 if config["extract"].get("device") == "cuda" else 0


def extract_params_m(wildcards):
    """Millions of parameters: read off a Pythia name (pythia-1.4b-deduped: 1400), BERT-base for MultiBERTs,
    a small number for toys, and a 1B guess for local runs (override with set-resources in the profile)."""
    size = re.match(r"pythia-(\d+(?:\.\d+)?)([mb])", wildcards.model)
    if wildcards.family == "pythia" and size:
        return float(size[1]) * (1000 if size[2] == "b" else 1)
    return {"multiberts": 110, "toy": 1}.get(wildcards.family, 1000)


def extract_mem_mb(wildcards, attempt):
    bytes_per_param = 4 if config["extract"].get("dtype", "float32") == "float32" else 2
    return int((2000 + 2.5 * bytes_per_param * extract_params_m(wildcards)) * attempt)


def extract_runtime(wildcards, attempt):
    params_per_minute = 200 if EXTRACT_GPU else 50  # millions of parameters through the forward passes a minute
    return int((15 + extract_params_m(wildcards) / params_per_minute) * attempt)


rule extract:
    input:
        weights="weights/{family}/{model}/step{step}",
        texts=rules.corpus.output[0],
    output:
        **{name: f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet" for name in EXTRACT_TABLES},
        info="results/{family}/{model}/step{step}/extract.json",
    params:
        settings=json_arg(config["extract"]),
        out="results/{family}/{model}/step{step}",
    threads: config["resources"]["extract_threads"]
    # Before any further fetch: a fetched checkpoint is extracted (and its weights deleted) first, so that the
    # disk holds the weights of the checkpoints in flight only, not the whole sweep's.
    priority: 1
    resources:
        gpu=EXTRACT_GPU,
        mem_mb=extract_mem_mb,
        runtime=extract_runtime,
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    shell:
        "{ANISWEEP} extract --manifest {input.weights}/checkpoint.json --texts {input.texts} "
        "--settings {params.settings} --threads {threads} --out {params.out} 2> {log}" + on_failure()
