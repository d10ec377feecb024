"""extract's `units` table: the sums of each resampling unit (anisweep.extract.streaming.Units) from a Recorder's
accumulators, which anisweep.measures.sum_bootstrap reweights. Each sequence's scalar sums are gathered into its unit
here (sums added; M2s merged by Chan et al.'s update, anisweep.moments), the vector sums were kept per unit."""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.extract.recorder import Recorder
from anisweep.extract.streaming import AttentionStats, Units, VectorStats
from anisweep.measures.rogue import ROGUE_SITES
from anisweep.moments import pooled_m2
from anisweep.tables import EXTRACT_SCHEMAS


def _by_unit(per_seq: np.ndarray, units: Units) -> np.ndarray:
    """(n_units, ...) sums of (n_sequences, ...) per-sequence sums."""
    out = np.zeros((units.n_units, *per_seq.shape[1:]))
    np.add.at(out, np.arange(units.n_sequences) // units.size, per_seq)
    return out


def merged_m2(n: np.ndarray, total: np.ndarray, m2: np.ndarray, units: Units) -> np.ndarray:
    """Each unit's M2 from its sequences' counts, sums and M2s (each about its own mean; moments.pooled_m2)."""
    unit = np.arange(units.n_sequences) // units.size
    return np.array([pooled_m2(n[unit == u], total[unit == u], m2[unit == u]) for u in range(units.n_units)])


def _row(table: str, layer: int, site: str, head: int | None, stat: str, values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=np.float64)
    width = int(np.prod(values.shape[1:])) if values.ndim > 1 else 1
    return {
        "table": table,
        "layer": layer,
        "site": site,
        "head": head,
        "stat": stat,
        "width": width,
        "values": values.reshape(-1).tolist(),
    }


def _hidden_rows(recorder: Recorder, units: Units) -> list[dict]:
    rows = []
    for (layer, site), s in sorted(recorder.vectors.items()):
        scalars = s.seq_scalars.cpu().numpy()
        n, n_zero, sum_norm, m2_norm = (scalars[:, i] for i in range(len(VectorStats.SEQ_SCALARS)))
        per_unit = {
            "n": _by_unit(n, units),
            "n_zero": _by_unit(n_zero, units),
            "sum_norm": _by_unit(sum_norm, units),
            "m2_norm": merged_m2(n, sum_norm, m2_norm, units),
        }
        vectors = s.unit_sums.cpu().numpy()
        per_unit |= {name: vectors[:, i] for i, name in enumerate(VectorStats.UNIT_VECTORS)}
        if s.unit_sum_sq is not None and site in ROGUE_SITES:  # the rogue dimensions' shares under reweighting
            per_unit["sum_unit_sq"] = s.unit_sum_sq.cpu().numpy()
        rows += [_row("hidden_stats", layer, site, None, stat, values) for stat, values in per_unit.items()]
    return rows


def _attention_rows(recorder: Recorder, units: Units) -> list[dict]:
    rows = []
    for layer, stats in sorted(recorder.attention.items()):
        counts = _by_unit(stats.seq_rows.cpu().numpy(), units)
        rows += [_row("attention", layer, "attention", None, "n_rows", counts[:, 0])]
        rows += [_row("attention", layer, "attention", None, "n_rows_norm", counts[:, 1])]
        # the sequences of each unit, in order: which unit a per-sequence value of another table is in (sinks')
        rows += [_row("attention", layer, "attention", None, "n_seqs", _by_unit(np.ones(units.n_sequences), units))]
        sums = _by_unit(stats.seq_sums.cpu().numpy(), units)  # (units, fields, heads)
        sinks = recorder.sinks.get(layer)
        first = _by_unit(sinks.seq_first.cpu().numpy(), units) if sinks is not None and sinks.n_seqs else None
        for head in range(sums.shape[2]):
            rows += [
                _row("attention", layer, "attention", head, name, sums[:, i, head])
                for i, name in enumerate(AttentionStats.FIELDS)
            ]
            if first is not None:  # the sum over the rows of p on the first valid key (the sinks table's)
                rows.append(_row("attention", layer, "attention", head, "first_received", first[:, head]))
    return rows


def _qk_rows(recorder: Recorder, units: Units) -> list[dict]:
    """Per query head its q sums and those of the key head it attends with (repeated over the query heads that share
    a key head, as the qk table's k_mean is)."""
    rows, group = [], recorder.geometry.group
    for (layer, rope), q in sorted(recorder.q.items()):
        k, site = recorder.k[(layer, rope)], f"qk_{rope}"
        if q.n_seqs == 0:  # a site this model never fed (no pre-rotary q of a model without rotation)
            continue
        rows += [_row("qk", layer, site, None, "n", _by_unit(q.seq_n.cpu().numpy(), units))]
        rows += [_row("qk", layer, site, None, "k_n", _by_unit(k.seq_n.cpu().numpy(), units))]
        q_norm, k_norm = (_by_unit(s.seq_sum_norm.cpu().numpy(), units) for s in (q, k))
        q_sums, k_sums = q.unit_sums.cpu().numpy(), k.unit_sums.cpu().numpy()
        for head in range(q_sums.shape[1]):
            kv_head = head // group
            rows += [
                _row("qk", layer, site, head, "q_sum", q_sums[:, head]),
                _row("qk", layer, site, head, "k_sum", k_sums[:, kv_head]),
                _row("qk", layer, site, head, "q_norm_sum", q_norm[:, head]),
                _row("qk", layer, site, head, "k_norm_sum", k_norm[:, kv_head]),
            ]
    return rows


def units_table(recorder: Recorder) -> pl.DataFrame:
    """The units' sums of the hidden states' statistics, of attention's per-head sums and of q and k; no rows where
    the recorder kept none (`extract.units` 0)."""
    units = recorder.units
    if units is None:
        return pl.DataFrame(schema=EXTRACT_SCHEMAS["units"])
    rows = _hidden_rows(recorder, units) + _attention_rows(recorder, units) + _qk_rows(recorder, units)
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["units"])
