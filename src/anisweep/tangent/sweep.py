"""Every analysed checkpoint's gradients.parquet of one model in one table, with the embedding-change rows."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from anisweep.tables import read_parquet


def gradients_sweep(
    paths: list[Path],
    bases: list[Path] = (),
    embeddings: list[Path] = (),
    fixed_bases: Path | None = None,
    settings: dict | None = None,
    fixed_shares: Path | None = None,
) -> pl.DataFrame:
    """Every checkpoint's gradients.parquet of one model, in one table sorted by step, with `fixed_shares` (the
    model's gradient_fixed_shares.parquet: the shares in its fixed subspaces) when given; with the checkpoints'
    `bases` and `embeddings` (gradient_bases.parquet, embedding_rows.parquet, in the same order) also the
    embedding-change rows (anisweep.tangent.embedding_change; measure embedding_change_*, from step_from to step)."""
    from anisweep.tangent import embedding_change

    if not paths:
        raise ValueError("gradients-sweep: no gradients.parquet given")
    tables = [read_parquet(p) for p in paths]
    sweep = pl.concat([*tables, *([read_parquet(fixed_shares)] if fixed_shares else [])], how="diagonal_relaxed")
    if embeddings:
        if len(bases) != len(embeddings) or len(embeddings) != len(paths):
            raise ValueError("gradients-sweep: give one --bases and one --embeddings file per gradients.parquet")
        settings = settings or {}
        from anisweep.tangent.settings import GradientSettings

        gs = GradientSettings(**settings)
        steps = [int(t["step"][0]) for t in tables]
        rows = embedding_change.sweep_rows(
            steps,
            dict(zip(steps, (read_parquet(p) for p in embeddings), strict=True)),
            dict(zip(steps, (read_parquet(p) for p in bases), strict=True)),
            read_parquet(fixed_bases) if fixed_bases and gs.subspaces != "per_checkpoint" else None,
            gs.n_random,
            gs.seed,
            per_checkpoint=gs.subspaces != "fixed",
        )
        if rows:
            ident = {t["step"][0]: t.select("family", "model", "seed", "step", "tokens_seen").row(0) for t in tables}
            columns = ("family", "model", "seed", "step", "tokens_seen")
            rows = [{**dict(zip(columns, ident[r["step"]], strict=True)), **r} for r in rows]
            change = pl.DataFrame(rows, infer_schema_length=None)
            sweep = pl.concat([sweep, change.cast({"step_from": pl.Int64}, strict=False)], how="diagonal_relaxed")
    return sweep.sort("step", "layer", "site", nulls_last=True)
