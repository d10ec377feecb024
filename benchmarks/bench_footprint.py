"""What a checkpoint's results take on disk, per file and per `extract.sample_precision`, measured and projected to
every Pythia size and to the whole Pythia suite; and the sample-based measures' error at each precision against
float32.

    python benchmarks/bench_footprint.py [--out benchmarks/out/footprint.json] [--tokens 1024]

Measured: extract runs once per model (untrained: the default config's two toy shapes, and a pythia-160m-shaped
GPT-NeoX with random weights, on --tokens random tokens kept whole), and its tables are written at each precision;
each file's bytes are read from disk. The sample-based measures (the metrics job's sample geometry, spectral shape
and q/k anisotropy rows, and the layer-by-layer CKA, SVCCA and PWCCA of anisweep.measures.compare) are computed on
the tables read back, and each precision's largest error against float32 is printed per metric.

Projected: hidden.parquet and qk_sample.parquet at bytes per stored component (measured on the pythia-160m-shaped
run, each precision's) times their components at the defaults of the schema (extract.sample_tokens 4096,
qk_sample_tokens 256): sample_tokens x (layers + 3 sites) x d_model, and qk_sample_tokens x layers x heads x 2 ropes x
(q, k) x d_head; units.parquet at its bytes per float times min(n_sequences, extract.units) units of unit_floats
each; the other tables scaled from the measured run by layers x d_model. The same formula at the toys'
shapes is printed against their measured bytes (its check). The whole suite: every model of the catalogue's Pythia
family (sizes, -deduped, -seed{n}) x its 154 steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from anisweep.adapters import adapter_for
from anisweep.checkpoints.hub import Pythia
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ATTENTION_NAME, ExtractSettings, LoadedModel
from anisweep.extract.recorder import register_attention
from anisweep.extract.run import run, write_extract
from anisweep.measures import compare, metrics
from anisweep.measures.grouped import vectors_by_group
from anisweep.sample_storage import PRECISIONS
from anisweep.schema import defaults
from anisweep.tables import read_parquet

ROOT = Path(__file__).resolve().parents[1]
SAMPLED = ("hidden", "qk_sample")
PROJECTED = (*SAMPLED, "units")  # the tables projected by their components, not by layers x d_model
IDENT = {"family": "bench", "model": "m", "seed": 0, "step": 0, "tokens_seen": 0}


def neox(d_model: int, n_layers: int, n_heads: int, vocab: int = 512):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        intermediate_size=4 * d_model,
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(config).eval()


def bert(d_model: int, n_layers: int, n_heads: int, vocab: int = 512):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        intermediate_size=4 * d_model,
    )
    torch.manual_seed(0)
    return BertForMaskedLM(config).eval()


def extract_at_every_precision(model, n_tokens: int, seq_len: int, folder: Path) -> dict[str, Path]:
    """Extract's tables of `model` over n_tokens random tokens (all kept whole), written once per precision."""
    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    adapter = adapter_for(model.config)
    loaded = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))
    n_sequences = n_tokens // seq_len
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (n_sequences, seq_len), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    settings = ExtractSettings(n_sequences=n_sequences, seq_len=seq_len, batch_size=4, sample_tokens=n_tokens)
    settings.device = "cpu"
    recorder = run(loaded, batch, settings, progress=False)
    out = {}
    for precision in PRECISIONS:
        written = extract_tables.tables(recorder, loaded, IDENT, tokenizer=None, precision=precision)
        out[precision] = folder / precision
        write_extract(out[precision], written, {"checkpoint": IDENT, "settings": {"sample_precision": precision}})
    return out


def file_bytes(folder: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_size for p in sorted(folder.glob("*.parquet"))}


def sample_measures(folder: Path) -> dict[tuple, float]:
    """Every sample-based value of one checkpoint's folder: {(metric, layer, head, site): value}; the comparisons are
    of each residual layer against the next (CKA, SVCCA, PWCCA)."""
    hidden, qk_sample = read_parquet(folder / "hidden.parquet"), read_parquet(folder / "qk_sample.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = metrics.sample_rows(hidden) + metrics.spectral_rows(hidden) + metrics.qk_sample_rows(qk_sample)
        by_site = vectors_by_group(hidden, ("layer", "site"), ("vector",))
        resid = {layer: g["vector"] for (layer, site), g in by_site if site == "resid"}
        for layer in sorted(resid)[:-1]:
            found = compare.builtin_rows(resid[layer], resid[layer + 1], compare.Settings())
            rows += [{**r, "layer": layer, "site": "resid"} for r in found]
    return {(r["metric"], r["layer"], r.get("head"), r["site"]): r["value"] for r in rows}


def errors(reference: dict[tuple, float], other: dict[tuple, float]) -> dict[str, dict[str, float]]:
    """Per metric: the largest absolute and relative difference of `other` from `reference` over its rows."""
    out: dict[str, dict[str, float]] = {}
    for key, value in reference.items():
        if not (math.isfinite(value) and math.isfinite(other.get(key, math.nan))):
            continue
        difference = abs(other[key] - value)
        found = out.setdefault(key[0], {"abs": 0.0, "rel": 0.0})
        found["abs"] = max(found["abs"], difference)
        found["rel"] = max(found["rel"], difference / abs(value) if value else 0.0)
    return out


def components(sample_tokens: int, qk_tokens: int, d_model: int, n_layers: int, n_heads: int) -> dict[str, int]:
    """The stored components of the sampled tables of a GPT-NeoX-shaped model (rotary: ropes pre and post)."""
    return {
        "hidden": sample_tokens * (n_layers + 3) * d_model,
        "qk_sample": qk_tokens * n_layers * n_heads * 2 * 2 * (d_model // n_heads),
    }


def unit_floats(d_model: int, n_layers: int, n_heads: int) -> int:
    """A resampling unit's floats in units.parquet of a GPT-NeoX-shaped model (docs/results.md): 3 d_model + 4 per
    sampled hidden-state site (layers + 3; the rogue dimensions' sum u_j^2 the third d_model), 3 per layer and 6 per
    head of attention, 2 + (2 d_head + 2) per head and rope."""
    d_head = d_model // n_heads
    return (
        (n_layers + 3) * (3 * d_model + 4)
        + n_layers * (3 + 6 * n_heads)
        + n_layers * 2 * (2 + n_heads * (2 * d_head + 2))
    )


def projected(
    per_component: dict, other_per_unit: float, shape, sample_tokens: int, qk_tokens: int, units: int
) -> float:
    """A checkpoint's bytes: the sampled tables by their components, units.parquet by its floats (`units` units),
    the rest by layers x d_model."""
    counts = components(sample_tokens, qk_tokens, shape.d_model, shape.n_layers, shape.n_heads)
    counts["units"] = units * unit_floats(shape.d_model, shape.n_layers, shape.n_heads)
    return sum(per_component[t] * counts[t] for t in PROJECTED) + other_per_unit * shape.n_layers * shape.d_model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "footprint.json")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens of the pythia-160m-shaped run (>= 768)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    from anisweep.toy.train import ToySpec

    spec = ToySpec()
    runs = {
        "toy-neox": (neox(spec.d_model, spec.n_layers, spec.n_heads), 1024, 64),
        "toy-bert": (bert(spec.d_model, spec.n_layers, spec.n_heads), 1024, 64),
        "pythia-160m-shaped": (neox(768, 12, 12, vocab=50304), args.tokens, 128),
    }
    report: dict = {"runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, n_tokens, seq_len) in runs.items():
            folders = extract_at_every_precision(model, n_tokens, seq_len, Path(tmp) / name)
            sizes = {p: file_bytes(f) for p, f in folders.items()}
            reference = sample_measures(folders["float32"])
            report["runs"][name] = {
                "tokens": n_tokens,
                "bytes": sizes,
                "errors": {p: errors(reference, sample_measures(f)) for p, f in folders.items() if p != "float32"},
            }
            print(f"{name}: measured in {n_tokens} tokens", file=sys.stderr)
    big = report["runs"]["pythia-160m-shaped"]
    shape160 = Pythia.shapes["160m"]
    counts160 = components(big["tokens"], min(256, big["tokens"]), 768, 12, 12)
    counts160["units"] = min(big["tokens"] // 128, defaults("extract")["units"]) * unit_floats(768, 12, 12)
    per_component = {p: {t: big["bytes"][p][t] / counts160[t] for t in PROJECTED} for p in PRECISIONS}
    other = sum(b for t, b in big["bytes"]["float32"].items() if t not in PROJECTED) / (12 * 768)
    extract = defaults("extract")
    sample_tokens, qk_tokens = extract["sample_tokens"], extract["qk_sample_tokens"]
    units = min(extract["n_sequences"], extract["units"])  # each sequence its own unit, up to extract.units
    report["per_component"] = per_component
    report["check"] = {}
    for name in ("toy-neox",):
        measured = report["runs"][name]["bytes"]
        shape = type(shape160)(spec.d_model, spec.n_layers, spec.n_heads)
        report["check"][name] = {
            p: {
                "measured": sum(measured[p][t] for t in SAMPLED),
                "projected": sum(
                    per_component[p][t] * c
                    for t, c in components(1024, 256, shape.d_model, shape.n_layers, shape.n_heads).items()
                ),
            }
            for p in PRECISIONS
        }
    sizes = {}
    for size, shape in Pythia.shapes.items():
        sizes[size] = {
            p: projected(per_component[p], other, shape, sample_tokens, qk_tokens, units) for p in PRECISIONS
        }
    report["units_per_checkpoint"] = {
        size: per_component["float32"]["units"] * units * unit_floats(shape.d_model, shape.n_layers, shape.n_heads)
        for size, shape in Pythia.shapes.items()
    }
    report["pythia_per_checkpoint"] = sizes
    models = Pythia.names()
    suite = {
        p: sum(sizes[Pythia._NAME.fullmatch(m)["size"]][p] for m in models) * len(Pythia.steps) for p in PRECISIONS
    }
    report["pythia_suite"] = {"checkpoints": len(models) * len(Pythia.steps), "bytes": suite}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print_tables(report)
    return report


def print_tables(report: dict) -> None:
    mb = lambda b: f"{b / 1e6:,.1f} MB" if b < 1e9 else f"{b / 1e9:,.2f} GB"  # noqa: E731
    print("| Pythia size | " + " | ".join(PRECISIONS) + " |\n|---|" + "---|" * len(PRECISIONS))
    for size, row in report["pythia_per_checkpoint"].items():
        print(f"| {size} | " + " | ".join(mb(row[p]) for p in PRECISIONS) + " |")
    suite = report["pythia_suite"]
    print(
        f"| all of Pythia ({suite['checkpoints']:,} checkpoints) | "
        + " | ".join(f"{suite['bytes'][p] / 1e12:.2f} TB" for p in PRECISIONS)
        + " |"
    )
    units = ", ".join(f"{size} {mb(b)}" for size, b in report["units_per_checkpoint"].items())
    print(f"units.parquet per checkpoint (float32 column included above): {units}")
    for name, check in report["check"].items():
        print(
            f"\ncheck, {name}: sampled tables measured / projected: "
            + ", ".join(f"{p} {c['measured']:,} / {c['projected']:,.0f} B" for p, c in check.items())
        )
    for name, found in report["runs"].items():
        print(f"\n{name} ({found['tokens']} tokens), largest error against float32 (abs / rel):")
        print("| metric | " + " | ".join(found["errors"]) + " |\n|---|" + "---|" * len(found["errors"]))
        metrics_ = sorted({m for e in found["errors"].values() for m in e})
        for m in metrics_:
            cells = [found["errors"][p].get(m, {"abs": math.nan, "rel": math.nan}) for p in found["errors"]]
            print(f"| {m} | " + " | ".join(f"{c['abs']:.2g} / {c['rel']:.2g}" for c in cells) + " |")
        b = found["bytes"]
        print(
            "bytes: "
            + "; ".join(f"{p}: " + ", ".join(f"{t} {b[p][t]:,}" for t in (*SAMPLED, "hidden_stats")) for p in b)
        )


if __name__ == "__main__":
    main()
