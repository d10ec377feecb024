EXTRACT_TABLES = ("qk", "attention", "hidden", "hidden_stats", "layernorm", "embeddings")


rule extract:
    input:
        "weights/{family}/{model}/step{step}",
    output:
        **{name: f"results/{{family}}/{{model}}/step{{step}}/{name}.parquet" for name in EXTRACT_TABLES},
        info="results/{family}/{model}/step{step}/extract.json",
    params:
        corpus=json_arg(config["corpus"]),
        settings=json_arg(config["extract"]),
        out="results/{family}/{model}/step{step}",
    threads: config["resources"]["extract_threads"]
    log:
        "logs/extract/{family}/{model}/step{step}.log",
    shell:
        "{ANISWEEP} extract --manifest {input}/checkpoint.json --corpus {params.corpus} "
        "--settings {params.settings} --threads {threads} --out {params.out} 2> {log}"
