"""The `compare` part: extract's tables on the device against the CPU's.

One random-weight checkpoint of each --compare-shapes shape (bert-base and pythia-160m), saved, extracted over a
padded batch of 8 x 512 (every table, the score histogram included) on the CPU in float32, then on the device in
float32 (attention auto: the Triton kernel) and in bfloat16; every table against the CPU's: the largest |device -
cpu| over each numeric column, relative to that column's largest |cpu| (at least 0.01), other columns equal; the top-k
tables (massive, sink_keys) item by item, so that two near-tied ranks swapped are their values' difference. float32
passes at 1e-5 (COMPARE_RTOL) through the kernel with no fallback; bfloat16 is reported, not judged. Beside it, the
same measure of HF's own eager float32 hidden states, device against CPU: the rounding that any float32 forward on
another device brings (on an H200, 1.7e-6 for bert-base and 2.3e-6 for pythia-160m). Values are not judged one by
one: a single hidden value, a sum over thousands of tokens or a histogram bin's count near its edge differ by 1e-3 of
itself between two float32 forwards, HF's as much. With `--device cpu` the CPU's tables are compared with
themselves, to check the code.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

from .core import BUDGET_SPENT, FAIL, NOT_RUN, PASS, cell_text, combine, shape_name, spawn_in_budget
from .models import hf_model, make_batch

COMPARE_RTOL = 1e-5  # float32 tables on the device against the CPU's
REL_FLOOR = 0.01  # a column's scale at least: COMPARE_RTOL * REL_FLOOR = 1e-7 absolute, the tests' atol
SCORE_BINS = {"low": -20.0, "high": 20.0, "n": 80}  # config/config.yaml's: the comparison covers score_hist too


def padded_batch(shape: str, n: int, seq_len: int) -> dict:
    """make_batch with padding, as an evaluation batch of texts of different lengths has: seq_len down to about
    half of it."""
    batch = make_batch(shape, n, seq_len)
    lengths = torch.tensor([seq_len - i * seq_len // (2 * n) for i in range(n)])
    batch["attention_mask"] = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 0)
    return batch


def extract_tables_on(path: str, batch: dict, device: str, dtype: str, threads: int) -> tuple[dict, dict]:
    """Every table extract writes for the checkpoint at `path` over `batch`, on `device` in `dtype`; and how it
    ran (the attention path, any warning: a FallbackWarning means the kernel declined a shape)."""
    import warnings

    from anisweep.extract import recorder as extract_recorder
    from anisweep.extract import tables as extract_tables
    from anisweep.extract.model import ExtractSettings, load_model
    from anisweep.extract.run import run

    n, t = batch["input_ids"].shape
    settings = ExtractSettings(
        n_sequences=n,
        seq_len=t,
        batch_size=max(1, n // 2),
        sample_tokens=min(n * t, 2048),  # more than d_model: the hidden table's statistics are full rank
        device=device,
        dtype=dtype,
        score_bins=SCORE_BINS,
    )
    torch.set_num_threads(threads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = load_model(path, dtype, settings.torch_device())
        kernel = extract_recorder.attention_kernel(settings.attention, settings.torch_device())
        started = time.perf_counter()
        recorder = run(parts, batch, settings, progress=False)
        seconds = time.perf_counter() - started
        ident = {"family": "bench", "model": "compare", "seed": 0, "step": 0, "tokens_seen": 0}
        tables = extract_tables.tables(recorder, parts, ident)
    said = sorted({f"{type(w.message).__name__}: {w.message}" for w in caught})
    return tables, {
        "device": device,
        "dtype": dtype,
        "attention": "torch" if kernel is None else "triton",
        "fallbacks": [w for w in said if w.startswith("FallbackWarning")],
        "warnings": said,
        "run_s": seconds,
    }


def compare(args) -> dict:
    """extract's tables of one random-weight checkpoint per shape on the CPU in float32, and on --device in
    float32 (judged) and bfloat16 (reported), each against the CPU's: table_difference per table."""
    shapes = []
    for shape in args.compare_shapes:
        batch = padded_batch(shape, args.n_sequences, args.seq_len)
        with tempfile.TemporaryDirectory() as tmp:
            model = hf_model(shape)
            model.save_pretrained(tmp)
            reference, ref_info = extract_tables_on(tmp, batch, "cpu", "float32", args.threads)
            runs = []
            for dtype in ("float32", "bfloat16"):
                tables, info = extract_tables_on(tmp, batch, args.device, dtype, args.threads)
                differences = {name: any_table_difference(name, tables[name], reference[name]) for name in reference}
                runs.append({**info, "judged": dtype == "float32", "tables": differences})
        hf = hf_hidden_difference(model, batch, args.device)
        shapes.append({"shape": shape, "reference": ref_info, "runs": runs, "hf_hidden": hf})
        print(f"  {shape}: " + "  ".join(f"{r['dtype']} {max_difference(r):.1e}" for r in runs), file=sys.stderr)
    return {
        "device": args.device,
        "n_sequences": args.n_sequences,
        "seq_len": args.seq_len,
        "rtol": COMPARE_RTOL,
        "rel_floor": REL_FLOOR,
        "shapes": shapes,
    }


def hf_hidden_difference(cpu, batch: dict, device: str) -> float:
    """HF's own eager float32 forward of the CPU model `cpu` on `device` against the CPU's, on the same weights and
    batch: the largest |device - cpu| over the hidden states of every layer, relative to their largest |cpu|
    (column_difference)."""
    import copy

    import numpy as np

    cpu.set_attn_implementation("eager")
    on_device = copy.deepcopy(cpu).to(device)
    with torch.inference_mode():
        ref = cpu(**batch, output_hidden_states=True).hidden_states
        got = on_device(**{k: v.to(device) for k, v in batch.items()}, output_hidden_states=True).hidden_states
    a = np.concatenate([h.cpu().double().numpy().ravel() for h in got])
    b = np.concatenate([h.double().numpy().ravel() for h in ref])
    return column_difference(a, b)


def column_difference(a, b) -> float:
    """The largest |a - b| relative to the column's scale, its largest finite |b| (at least REL_FLOOR); NaN against
    NaN is equal, NaN or inf against a number infinitely far."""
    import numpy as np

    finite = np.abs(b[np.isfinite(b)])
    scale = max(float(finite.max(initial=0.0)), REL_FLOOR)
    with np.errstate(invalid="ignore"):
        rel = np.abs(a - b) / scale
    rel[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    return float(np.nan_to_num(rel, nan=np.inf).max(initial=0.0))


def table_difference(got, ref) -> dict:
    """The largest column_difference over the numeric columns of two tables (list columns value by value), and its
    column; non-numeric columns must be equal, as must the columns, rows and list lengths (inf where they are
    not)."""
    import numpy as np
    import polars as pl

    if got.columns != ref.columns or got.height != ref.height:
        return {"max_rel": float("inf"), "column": "(columns or rows)"}
    worst, where = 0.0, None
    for column in ref.columns:
        x, y = got[column], ref[column]
        if isinstance(y.dtype, pl.List):
            if not isinstance(x.dtype, pl.List) or x.list.len().to_list() != y.list.len().to_list():
                return {"max_rel": float("inf"), "column": column}
            x, y = x.explode(), y.explode()
        if x.dtype.is_numeric() and y.dtype.is_numeric():
            rel = column_difference(*(np.array(v.to_list(), dtype=np.float64) for v in (x, y)))
        else:
            rel = 0.0 if x.to_list() == y.to_list() else float("inf")
        if rel > worst:
            worst, where = rel, column
    return {"max_rel": worst, "column": where}


#: The tables that list the top tokens or keys of a group by a value, largest first: the group's columns, the columns
#: that name a listed item, the value it is ranked by, and the other numbers compared item by item.
RANKED = {
    "massive": (("layer", "site"), ("seq", "position"), "value", ()),
    "sink_keys": (("layer", "head"), ("seq", "position"), "received", ("share",)),
}


def any_table_difference(name: str, got, ref) -> dict:
    """ranked_difference for the RANKED tables, table_difference for the others."""
    if name in RANKED:
        return ranked_difference(got, ref, *RANKED[name])
    return table_difference(got, ref)


def ranked_difference(got, ref, group: tuple, item: tuple, ranked_by: str, numbers: tuple) -> dict:
    """Two top-k lists per group compared item by item, not row by row: a near tie that swaps two ranks, or an item at
    the k-th place that the other list replaces with one of equal value, is no difference. Over the items both lists
    name, the largest column_difference of `ranked_by` and `numbers` (each relative to its column's largest |ref|);
    an item only one list names differs by at least its value minus the other list's smallest (the value it would
    need to be listed there), which counts the same way. `shared` is the share of the listed items that both lists
    name with the same other columns (dim, token): reported, not judged. Groups, or list lengths, that differ are
    infinitely far."""
    import numpy as np

    if got.columns != ref.columns:
        return {"max_rel": float("inf"), "column": "(columns)", "shared": 0.0}
    scale = {c: max(float(ref[c].abs().max() or 0.0), REL_FLOOR) for c in (ranked_by, *numbers)}
    got_groups, ref_groups = (dict(t.group_by(list(group), maintain_order=True).__iter__()) for t in (got, ref))
    if got_groups.keys() != ref_groups.keys():
        return {"max_rel": float("inf"), "column": "(groups)", "shared": 0.0}
    worst, where, shared, listed = 0.0, None, 0, 0
    for key, ref_rows in ref_groups.items():
        got_rows = got_groups[key]
        if got_rows.height != ref_rows.height:
            return {"max_rel": float("inf"), "column": "(list lengths)", "shared": 0.0}
        mine, theirs = (
            {tuple(row[c] for c in item): row for row in rows.iter_rows(named=True)} for rows in (got_rows, ref_rows)
        )
        differences = []
        for ident in mine.keys() & theirs.keys():
            a, b = mine[ident], theirs[ident]
            differences += [(_gap(a[c], b[c]) / scale[c], c) for c in (ranked_by, *numbers)]
            shared += all(a[c] == b[c] for c in a if c not in ("rank", ranked_by, *numbers))
        for own, other in ((mine, theirs), (theirs, mine)):
            floor = min(float(row[ranked_by]) for row in other.values())
            for ident in own.keys() - other.keys():
                differences.append((max(0.0, float(own[ident][ranked_by]) - floor) / scale[ranked_by], ranked_by))
        listed += ref_rows.height
        for rel, column in differences:
            rel = float(np.nan_to_num(rel, nan=np.inf))
            if rel > worst:
                worst, where = rel, column
    return {"max_rel": worst, "column": where, "shared": shared / listed if listed else 1.0}


def _gap(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    return 0.0 if a == b else abs(float(a) - float(b))


def max_difference(run: dict) -> float:
    return max((t["max_rel"] for t in run["tables"].values()), default=0.0)


def comparison(a) -> dict:
    res = spawn_in_budget(
        a,
        "compare",
        "compare",
        f"[compare] {', '.join(a.compare_shapes)}: tables on the CPU and on {a.device} ...",
        compare_shapes=a.compare_shapes,
        device=a.device,
        n_sequences=a.compare_n,
        seq_len=a.compare_seq,
        threads=os.cpu_count() or a.threads,  # the CPU's reference, no ratio: every core
    )
    if res is None:
        return dict(BUDGET_SPENT)
    print(f"  {comparison_line(res)['measured']}", flush=True)
    return res


def compare_run_verdict(run: dict, rtol: float) -> tuple[str, str]:
    """A float32 run on the device against the CPU's tables: every table within rtol, through the Triton kernel on
    CUDA (torch ops on the CPU), with no fallback to the torch path."""
    if not run["judged"]:
        return "reported", ""
    wants = "triton" if run["device"].startswith("cuda") else "torch"
    reasons = [
        f"{name} {t['max_rel']:.1e} in {t['column']}" for name, t in run["tables"].items() if not t["max_rel"] <= rtol
    ]
    if run["attention"] != wants:
        reasons.append(f"attention ran as {run['attention']}, not {wants}")
    reasons += [cell_text(w, 200) for w in run["fallbacks"]]
    return (FAIL if reasons else PASS), "; ".join(reasons)


def comparison_line(res: dict | None) -> dict:
    goal = (
        f"{(res or {}).get('device', 'device')} tables equal CPU tables (float32: {rtol_text(COMPARE_RTOL)} relative)"
    )
    if not res or "error" in res:
        error = (res or {}).get("error", "not run")
        return {"goal": goal, "measured": cell_text(error), "verdict": NOT_RUN if error.startswith("not run") else FAIL}
    judged = [(shape, run) for shape in res["shapes"] for run in shape["runs"] if run["judged"]]
    measured = ", ".join(
        f"{shape_name(shape['shape'])} {run['device']} {max_difference(run):.1e} over {len(run['tables'])} tables"
        for shape, run in judged
    )
    verdicts = [compare_run_verdict(run, res["rtol"])[0] for _, run in judged]
    return {"goal": goal, "measured": measured or "no table", "verdict": combine(verdicts)}


def ranked_text(res: dict) -> str:
    tables = [t for s in res["shapes"] for run in s["runs"] for t in run["tables"].values()]
    if not any("shared" in t for t in tables):
        return ""
    return (
        f" The top-k tables ({', '.join(RANKED)}) item by item: a value's difference where both runs list an item, "
        "where one does, its value above the other's smallest; in brackets the share of the items both list."
    )


def difference_text(table: dict) -> str:
    """A table's cell: its largest difference, and for a RANKED table the share of the top items both runs list."""
    text = f"{table['max_rel']:.1e}"
    return text + (f" ({table['shared']:.0%} shared)" if "shared" in table else "")


def rtol_text(rtol: float) -> str:
    return f"{rtol:.0e}".replace("e-0", "e-")


def comparison_summary(res: dict) -> list[str]:
    line = comparison_line(res)
    if "error" in res:
        return [
            "### Device tables against the CPU's",
            "",
            f"{line['verdict']}: {line['measured'].removeprefix('not run: ')}",
        ]
    names = list(res["shapes"][0]["runs"][0]["tables"]) if res["shapes"] else []
    lines = [
        "### Device tables against the CPU's",
        "",
        "Largest |device - cpu| of each table against the CPU's float32 tables, relative to its column's largest "
        f"|cpu| (at least {res['rel_floor']}); {res['n_sequences']} x {res['seq_len']} tokens, padded; float32 judged "
        f"at {rtol_text(res['rtol'])}, bfloat16 reported.{ranked_text(res)} HF's own eager float32 hidden states, "
        f"{res['device']} against the CPU, by the same measure: "
        + ", ".join(f"{shape_name(s['shape'])} {s['hf_hidden']:.1e}" for s in res["shapes"] if "hf_hidden" in s)
        + ".",
        "",
        f"| shape | run | path | {' | '.join(names)} | verdict |",
        "|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for shape in res["shapes"]:
        for run in shape["runs"]:
            verdict, why = compare_run_verdict(run, res["rtol"])
            values = " | ".join(difference_text(run["tables"][name]) for name in names)
            lines.append(
                f"| {shape_name(shape['shape'])} | {run['device']} {run['dtype']} | {run['attention']} | "
                f"{values} | {verdict + (f' ({cell_text(why, 400)})' if why else '')} |"
            )
    return lines
