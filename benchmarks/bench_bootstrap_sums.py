"""The Multi-Bootstrap of config/multiberts_seeds.yaml's measures (those built of sums, and IsoScore of the sampled
vectors) beside extract, in one process: a MultiBERTs group of 5 seeds x 29 steps at B = 1,000 (run by hand).

    OMP_NUM_THREADS=1 python benchmarks/bench_bootstrap_sums.py [--repeat 3] [--settings default|multiberts]
    python benchmarks/bench_bootstrap_sums.py --quick    # a tiny shape, seconds: checks the code (tests run it)

Extract of one bert-base checkpoint (random weights, no download) at the schema's default extract settings (64
sequences of 128 tokens, 4,096 sampled, 32 resampling units) or config/multiberts_seeds.yaml's (`--settings
multiberts`: 128 sequences of 512 tokens, 8,192 sampled, 32 units) writes its tables and metrics.parquet's rows of
the sampled vectors (IsoScore's estimate; not timed), and the same folder again as four more seeds; then
`anisweep.measures.sample_bootstrap.bootstrap_table` resamples that step of the 5 seeds at B = 1,000, --repeat
times, with the same thread count (one, as a Snakemake job of one thread: set OMP_NUM_THREADS=1 so that numpy's BLAS
uses one too). Both are process CPU seconds of this process, the bootstrap's the median of the repetitions; the
group is 29 bootstrap steps against 145 extracts (goal: under 5%). Then the comparisons of two steps: each seed's
folder written again as a later step, and linear CKA of the two (`cka`: the step against the final and the later one
against the previous, as an inner step of the grid has both), resampled once for the 5 seeds: its CPU seconds are a
step's added cost of `cka` in bootstrap.measures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl
import torch
import transformers

from anisweep.adapters import adapter_for
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ATTENTION_NAME, ExtractSettings, LoadedModel
from anisweep.extract.recorder import register_attention
from anisweep.extract.run import run, write_extract
from anisweep.measures import metrics
from anisweep.measures import sample_bootstrap as sb
from anisweep.tables import metric_rows

HERE = Path(__file__).resolve()
MEASURES = (
    "isoscore", "avg_cos", "drift_ratio", "norm_std", "rogue_top1_share", "entropy_mean", "entropy_norm_mean",
    "sink_first_mass", "qk_cos",
)  # fmt: skip
FULL = {"config": {}, "n_sequences": 64, "seq_len": 128, "sample_tokens": 4096, "samples": 1000}
MULTIBERTS = {**FULL, "n_sequences": 128, "seq_len": 512, "sample_tokens": 8192}
UNITS = 32
QUICK = {
    "config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "n_sequences": 8,
    "seq_len": 32,
    "sample_tokens": 128,
    "samples": 50,
}
SEEDS, STEPS, GOAL = 5, 29, 0.05


def extract_step(root: Path, shape: dict) -> float:
    """Extract one random-weight bert checkpoint into root/seed_0, written again as seeds 1-4; its CPU seconds."""
    register_attention()
    config = transformers.BertConfig(**shape["config"])
    model = transformers.BertForMaskedLM(config).eval()
    model.set_attn_implementation(ATTENTION_NAME)
    adapter = adapter_for(config)
    loaded = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(config))
    n, t = shape["n_sequences"], shape["seq_len"]
    ids = torch.randint(1000, config.vocab_size, (n, t), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    settings = ExtractSettings(
        n_sequences=n, seq_len=t, batch_size=8, sample_tokens=shape["sample_tokens"], units=UNITS
    )
    settings.device = "cpu"
    started = time.process_time()
    recorder = run(loaded, batch, settings, progress=False)
    ident = {"family": "multiberts", "model": "seed_0", "seed": 0, "step": 20000, "tokens_seen": 0}
    written = extract_tables.tables(recorder, loaded, ident, tokenizer=None)
    seconds = time.process_time() - started
    for seed in range(SEEDS):
        folder = root / f"seed_{seed}"
        named = {
            name: df.with_columns(pl.lit(f"seed_{seed}").alias("model")) if "model" in df.columns else df
            for name, df in written.items()
        }
        write_extract(folder, named, {"settings": {"n_sequences": n, "units": UNITS}})
        hidden = named["hidden"]
        metric_rows(ident | {"model": f"seed_{seed}"}, metrics.sample_rows(hidden), "sample_geometry").write_parquet(
            folder / "metrics.parquet"
        )
    return seconds


def later_step(root: Path) -> None:
    """Each seed's folder again as a later step (seed_{s}_later), its tables' step moved."""
    for seed in range(SEEDS):
        folder, later = root / f"seed_{seed}", root / f"seed_{seed}_later"
        shutil.copytree(folder, later)
        for table in later.glob("*.parquet"):
            frame = pl.read_parquet(table)
            if "step" in frame.columns:
                frame.with_columns(pl.col("step") + 20000).write_parquet(table)


def comparison_step(root: Path, samples: int) -> float:
    """CPU seconds of the comparisons of two steps (CKA, each direction once) over the 5 seeds."""
    started = time.process_time()
    folders = [[root / f"seed_{seed}", root / f"seed_{seed}_later"] for seed in range(SEEDS)]
    sb.bootstrap_table(folders, sb.Settings(samples=samples, measures=("cka",)), group="g")
    return time.process_time() - started


def bootstrap_step(root: Path, samples: int) -> tuple[float, int]:
    """(CPU seconds, rows) of one step's bootstrap_table over the 5 seeds."""
    started = time.process_time()
    table = sb.bootstrap_table(
        [[root / f"seed_{seed}"] for seed in range(SEEDS)], sb.Settings(samples=samples, measures=MEASURES), group="g"
    )
    return time.process_time() - started, table.height


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settings", choices=["default", "multiberts"], default="default", help="extract's settings")
    ap.add_argument("--out", type=Path, help="default benchmarks/out/bootstrap_sums[_multiberts].json")
    a = ap.parse_args(argv)
    shape = QUICK if a.quick else MULTIBERTS if a.settings == "multiberts" else FULL
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-sums-"))
    try:
        extract_s = extract_step(root, shape)
        runs = [bootstrap_step(root, shape["samples"]) for _ in range(a.repeat)]
        later_step(root)
        cka_s = comparison_step(root, shape["samples"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    step_s = statistics.median(s for s, _ in runs)
    out = {
        "shape": "bert-tiny" if a.quick else "bert-base",
        "extract_settings": a.settings,
        "settings": {k: v for k, v in shape.items() if k != "config"},
        "measures": list(MEASURES),
        "rows_per_step": runs[0][1],
        "extract_cpu_s": extract_s,
        "bootstrap_step_cpu_s": [s for s, _ in runs],
        "group_bootstrap_cpu_s": step_s * STEPS,
        "group_extract_cpu_s": extract_s * SEEDS * STEPS,
        "share": step_s / (extract_s * SEEDS),
        "goal": GOAL,
        "cka_step_cpu_s": cka_s,
        "cka_share": cka_s / (extract_s * SEEDS),
    }
    print(
        f"{out['shape']}: extract {extract_s:.1f} CPU-s a checkpoint; bootstrap of one step of {SEEDS} seeds at B = "
        f"{shape['samples']}: {step_s:.2f} CPU-s (median of {a.repeat}), {runs[0][1]} rows; the group ({SEEDS} x "
        f"{STEPS}): {out['group_bootstrap_cpu_s']:.0f} CPU-s against {out['group_extract_cpu_s']:.0f}, "
        f"{out['share']:.1%} (goal {GOAL:.0%}); CKA of each step with the previous and the final step: "
        f"{cka_s:.2f} CPU-s a step, {out['cka_share']:.1%} more"
    )
    if not a.quick:
        path = a.out or HERE.parent / "out" / f"bootstrap_sums{'' if a.settings == 'default' else '_multiberts'}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
