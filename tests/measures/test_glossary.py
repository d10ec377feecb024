"""The glossary (anisweep.measures.glossary): docs/metrics.md is built from it, and it names every metric, site
and column that metrics.parquet gets for real tiny checkpoints of every supported architecture."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import torch
import transformers
from test_metrics import measure_checkpoint
from weightcheck import weight_metrics

from anisweep.checkpoints.audit import AUDIT_COLUMNS, FLAGGED
from anisweep.measures import glossary
from anisweep.measures.gradient_metrics import GRADIENT_METRICS
from anisweep.measures.metrics import checkpoint_metrics
from anisweep.measures.sites import ATTENTION_STREAM_SITES
from anisweep.measures.sweep import SWEEP_SCHEMA, UNFINISHED
from anisweep.tables import ATTENTION_STATISTICS, METRIC_SCHEMA, write_atomic

from conftest import (
    albert_config,
    bert_config,
    canine_config,
    gpt2_config,
    llama_config,
    neox_config,
    olmo2_config,
    olmo_config,
    padded_batch,
    roberta_config,
    run_extract,
    saved,
    t5_config,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

ARCHITECTURES = {
    "bert": (transformers.BertForMaskedLM, bert_config),
    "gpt_neox": (transformers.GPTNeoXForCausalLM, neox_config),
    "gpt2": (transformers.GPT2LMHeadModel, gpt2_config),
    "llama": (transformers.LlamaForCausalLM, llama_config),
    "olmo": (transformers.OlmoForCausalLM, olmo_config),
    "olmo2": (transformers.Olmo2ForCausalLM, olmo2_config),
}
#: Architectures the gradient analysis does not cover: their extract tables' metrics alone.
WITHOUT_GRADIENTS = {
    "roberta": (transformers.RobertaForMaskedLM, roberta_config),
    "albert": (transformers.AlbertForMaskedLM, albert_config),
    "t5": (transformers.T5ForConditionalGeneration, t5_config),
    "canine": (transformers.CanineModel, canine_config),
}


def _mit_config():
    return transformers.SegformerConfig(
        depths=[1, 1, 1, 1],
        sr_ratios=[4, 2, 1, 1],
        hidden_sizes=[8, 16, 24, 32],
        strides=[4, 2, 2, 2],
        num_attention_heads=[1, 2, 3, 4],
        mlp_ratios=[2, 2, 2, 2],
    )


#: Image models, on pixels: a vision transformer, a hierarchical one and a convolutional network.
IMAGE_MODELS = {
    "vit": (
        transformers.ViTModel,
        lambda: transformers.ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
        ),
    ),
    "mit": (transformers.SegformerModel, _mit_config),
    "resnet": (
        transformers.ResNetModel,
        lambda: transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]),
    ),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, pl.DataFrame]:
    """metrics.parquet (with the gradient analysis's rows) of a tiny checkpoint of every architecture."""
    out = {}
    for name, (cls, config) in ARCHITECTURES.items():
        _, out[name] = measure_checkpoint(tmp_path_factory.mktemp(name), cls, config())
    for name, (cls, config) in WITHOUT_GRADIENTS.items():
        folder = tmp_path_factory.mktemp(name)
        tables, _ = run_extract(saved(folder, cls, config(), "m"), padded_batch(n=5, t=12))
        for table, df in tables.items():
            write_atomic(df, folder / f"{table}.parquet")
        out[name] = checkpoint_metrics(folder)
    for name, (cls, config) in IMAGE_MODELS.items():
        folder = tmp_path_factory.mktemp(name)
        pixels = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        path = saved(folder, cls, config(), "m")
        if name == "vit":  # a final LayerNorm gain 20 standard deviations out: ln_gain_outlier_dim_1 is written
            model = cls.from_pretrained(path)
            with torch.no_grad():
                model.layernorm.weight[3] = 25.0
            model.save_pretrained(path)
        tables, _ = run_extract(path, {"pixel_values": pixels})
        for table, df in tables.items():
            write_atomic(df, folder / f"{table}.parquet")
        out[name] = checkpoint_metrics(folder)
    out["weights"] = weight_metrics(tmp_path_factory.mktemp("weights"))  # circuits and the logit lens
    return out


def test_docs_metrics_md_is_built_from_the_glossary():
    """docs/metrics.md is glossary_markdown(): rewrite it with `python -m anisweep.measures.glossary`."""
    assert DOCS.read_text(encoding="utf-8") == glossary.glossary_markdown()


def test_the_glossary_is_consistent():
    for table in (glossary.METRICS, glossary.SITES, glossary.COLUMNS):
        repeated = [name for name, n in Counter(t.name for t in table).items() if n > 1]
        assert not repeated
        assert all(t.definition and t.source and "\n" not in t.definition for t in table)
    for term in glossary.METRICS:
        assert term.sites and set(term.sites) <= glossary.site_names(), term.name
    assert glossary.column_names() == set(METRIC_SCHEMA) | set(SWEEP_SCHEMA) | set(AUDIT_COLUMNS)
    assert set(GRADIENT_METRICS) | set(ATTENTION_STATISTICS) <= glossary.metric_names()
    from anisweep.extract.recorder import SAMPLED_SITES

    assert glossary.SAMPLED_SITES == SAMPLED_SITES


def test_every_status_word_has_one_meaning_in_the_glossary():
    """A partial sweep's step without metrics and the audit's branch that does not exist were both `missing`: every
    status the sweep and the audit write is listed once, and the sweep's own verdicts on a checkpoint it ran are
    no audit status (a step the audit left out carries its audit status in the sweep)."""
    names = [status.name for status in glossary.STATUSES]
    assert len(names) == len(set(names))
    assert all(s.where and s.meaning and "\n" not in s.meaning for s in glossary.STATUSES)
    audit = {"ok", "unchecked", *FLAGGED}
    sweep = {"ok", "duplicate", "nonfinite", "nan", UNFINISHED}
    assert set(names) == audit | sweep
    assert not ({"nonfinite", "nan", UNFINISHED} & audit)
    assert "## Statuses" in glossary.glossary_markdown() and "| `unfinished` |" in glossary.glossary_markdown()


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_every_metric_and_site_written_is_in_the_glossary(written):
    sites_of = {term.name: set(term.sites) for term in glossary.METRICS}
    for name, metrics in written.items():
        assert set(metrics.columns) <= glossary.column_names(), name
        assert set(metrics["metric"]) <= glossary.metric_names(), (name, set(metrics["metric"]) - sites_of.keys())
        assert set(metrics["site"]) <= glossary.site_names(), (name, set(metrics["site"]) - glossary.site_names())
        pairs = metrics.select("metric", "site").unique().iter_rows()
        misplaced = sorted((metric, site) for metric, site in pairs if site not in sites_of[metric])
        assert not misplaced, (name, misplaced)


@pytest.mark.slow  # its fixture runs every architecture (~18 s): the quick subset leaves it to the full run
def test_every_glossary_entry_is_written_by_some_architecture(written):
    """No stale entry: each metric, site and (metric, site) the glossary lists occurs in some metrics.parquet (but
    the sites only a stream measure sees, which test_stream_sites.py feeds)."""
    everything = pl.concat(written.values())
    assert glossary.metric_names() == set(everything["metric"])
    assert glossary.site_names() - set(ATTENTION_STREAM_SITES) == set(everything["site"])
    pairs = set(everything.select("metric", "site").unique().iter_rows())
    listed = {(term.name, site) for term in glossary.METRICS for site in term.sites}
    # a row only where something is found (the first gain outlier of a norm that has one): some of its sites at least
    found_only = {"ln_gain_outlier_dim_1"}
    assert {(m, s) for m, s in pairs if m in found_only} <= {(m, s) for m, s in listed if m in found_only}
    assert any(m in found_only for m, _ in pairs)
    listed = {(m, s) for m, s in listed if m not in found_only}
    pairs = {(m, s) for m, s in pairs if m not in found_only}
    assert listed == pairs, (sorted(listed - pairs), sorted(pairs - listed))


def test_the_trainer_loggers_names_are_glossary_metrics_at_their_sites():
    """Each metric AnisweepCallback sends to the Trainer's loggers is a glossary metric, at sites the glossary lists
    for it, made by one of the measures it names; docs/metrics.md gives their naming scheme."""
    from anisweep.measures.logged import LOGGED, LOGGED_MEASURES, scalar_name
    from anisweep.measures.metrics import builtin_measures

    sites_of = {term.name: set(term.sites) for term in glossary.METRICS}
    for metric, sites in LOGGED:
        assert metric in sites_of and set(sites) <= sites_of[metric], metric
    assert set(LOGGED_MEASURES) <= {m.name for m in builtin_measures()}
    assert scalar_name("avg_cos", "resid", 3) == "geometry/avg_cos/resid/layer_3"
    markdown = glossary.glossary_markdown()
    assert "## Trainer loggers" in markdown and "`geometry/<metric>/<site>/layer_<n>`" in markdown
    assert all(f"`{scalar_name(metric, '<site>', '<n>')}`" in markdown for metric, _ in LOGGED)
