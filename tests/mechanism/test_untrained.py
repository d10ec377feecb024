"""The untrained block with an injected bias: every number against an eager float64 computation by hand."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from anisweep.mechanism import untrained
from anisweep.mechanism.untrained import UntrainedSettings
from anisweep.tables import UNTRAINED_SCHEMAS

TINY = dict(
    n_sequences=3,
    seq_len=9,
    batch_size=2,
    norms=[0, 1, 10],
    n_seeds=1,
    seed=3,
    d_model=16,
    n_heads=2,
    d_ff=32,
    vocab_size=50,
    score_min=0.01,
    score_max=1.0,
    bins_per_decade=3,
)


def _ln(x, module):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight.double() + module.bias.double()


def _linear(x, module):
    return x @ module.weight.double().T + module.bias.double()


def _heads(x, n_heads):
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _softmax(scores, visible):
    s = scores.masked_fill(~visible, -math.inf)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _rotary(x, rotary_dims):
    """Rotary embedding of the first rotary_dims dims of x (B, H, T, d_head), base 10000, by hand."""
    t = x.shape[2]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    rot, rest = x[..., :rotary_dims], x[..., rotary_dims:]
    half = rotary_dims // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    return torch.cat([rot * cos + rotated * sin, rest], -1)


@torch.no_grad()
def brute_force(block, x):
    """q, k (B, H, T, d_head), scores and p (B, H, T, T), the visible pairs and the block's output, float64."""
    x = x.double()
    n_heads = block.geometry.n_heads
    b, t, d = x.shape
    d_head = d // n_heads
    layer = block.block
    if not block.geometry.causal:  # BERT
        visible = torch.ones(t, t, dtype=torch.bool)
        sa = layer.attention.self
        q, k, v = (_heads(_linear(x, m), n_heads) for m in (sa.query, sa.key, sa.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)
        p = _softmax(scores, visible)
        context = (p @ v).transpose(1, 2).reshape(b, t, d)
        h = _ln(_linear(context, layer.attention.output.dense) + x, layer.attention.output.LayerNorm)
        inner = _gelu(_linear(h, layer.intermediate.dense))
        output = _ln(_linear(inner, layer.output.dense) + h, layer.output.LayerNorm)
    else:
        visible = torch.ones(t, t, dtype=torch.bool).tril()
        attn = layer.attention
        qkv = _linear(_ln(x, layer.input_layernorm), attn.query_key_value).view(b, t, n_heads, 3 * d_head)
        qkv = qkv.transpose(1, 2)
        q, k, v = qkv[..., :d_head], qkv[..., d_head : 2 * d_head], qkv[..., 2 * d_head :]
        q, k = _rotary(q, block.geometry.rotary_dims), _rotary(k, block.geometry.rotary_dims)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)
        p = _softmax(scores, visible)
        attn_out = _linear((p @ v).transpose(1, 2).reshape(b, t, d), attn.dense)
        mlp = layer.mlp
        mlp_out = _linear(_gelu(_linear(_ln(x, layer.post_attention_layernorm), mlp.dense_h_to_4h)), mlp.dense_4h_to_h)
        output = x + attn_out + mlp_out
    return {"q": q, "k": k, "scores": scores, "p": p, "visible": visible.expand(b, n_heads, t, t), "output": output}


def pairwise_avg_cos(x):
    """Mean cosine over the distinct ordered pairs, from the full Gram matrix."""
    x = x.reshape(-1, x.shape[-1]).double()
    unit = x / x.norm(dim=-1, keepdim=True)
    gram = unit @ unit.T
    return float(gram[~torch.eye(len(x), dtype=torch.bool)].mean())


def expected_rows(bf, x) -> dict:
    """(site, head, metric) -> value, computed from the brute-force tensors."""
    out = {}
    for site, vectors in (("input", x.double()), ("output", bf["output"])):
        flat = vectors.reshape(-1, vectors.shape[-1])
        out[(site, None, "avg_cos")] = pairwise_avg_cos(flat)
        out[(site, None, "norm_mean")] = float(flat.norm(dim=-1).mean())
        out[(site, None, "drift_norm")] = float(flat.mean(0).norm())
    n_heads = bf["q"].shape[1]
    p, scores, visible = bf["p"], bf["scores"], bf["visible"]
    for h in range(n_heads):
        for site in ("q", "k"):
            flat = bf[site][:, h].reshape(-1, bf[site].shape[-1])
            out[(site, h, "avg_cos")] = pairwise_avg_cos(flat)
            out[(site, h, "norm_mean")] = float(flat.norm(dim=-1).mean())
            out[(site, h, "drift_norm")] = float(flat.mean(0).norm())
        rows = {"p_max_mean": [], "p_median_mean": [], "p_min_mean": [], "entropy_mean": []}
        seq_max, seq_min = [], []
        for s in range(p.shape[0]):
            maxes, mins = [], []
            for i in range(p.shape[2]):
                row = p[s, h, i][visible[s, h, i]].numpy()
                rows["p_max_mean"].append(row.max())
                rows["p_median_mean"].append(np.median(row))
                rows["p_min_mean"].append(row.min())
                rows["entropy_mean"].append(-(row * np.log(row)).sum())
                if len(row) > 1:
                    maxes.append(row.max())
                    mins.append(row.min())
            seq_max.append(max(maxes))
            seq_min.append(min(mins))
        for name, values in rows.items():
            out[("attention", h, name)] = float(np.mean(values))
        out[("attention", h, "seq_p_max_mean")] = float(np.mean(seq_max))
        out[("attention", h, "seq_p_min_mean")] = float(np.mean(seq_min))
        visible_scores = scores[:, h][visible[:, h]].numpy()
        out[("attention", h, "score_mean")] = float(visible_scores.mean())
        out[("attention", h, "score_std")] = float(visible_scores.std())
    for site in ("q", "k", "attention"):
        for metric in {m for (s, h, m) in out if s == site and h is not None}:
            if metric in ("seq_p_max_mean", "seq_p_min_mean"):
                continue
            out[(site, None, metric)] = float(np.mean([out[(site, h, metric)] for h in range(n_heads)]))
    several = visible & (visible.sum(-1, keepdim=True) > 1)  # rows with more than one visible key
    masked = lambda fill: p.masked_fill(~several, fill)  # noqa: E731
    out[("attention", None, "seq_p_max_mean")] = float(masked(-1.0).amax(dim=(1, 2, 3)).mean())
    out[("attention", None, "seq_p_min_mean")] = float(masked(2.0).amin(dim=(1, 2, 3)).mean())
    return out


def _saved_checkpoint(tmp_path, arch):
    """A tiny saved checkpoint (conftest's `saved`: seeded weights, non-trivial LayerNorms)."""
    from transformers import BertForMaskedLM, GPTNeoXForCausalLM

    from conftest import bert_config, neox_config, saved

    if arch == "bert":
        # no padding token: BERT's init zeroes its embedding row, and a zero vector has no direction, so its
        # cosines (the brute force's NaN) are not defined; the sweep's streaming sums count it in n regardless
        return saved(tmp_path, BertForMaskedLM, bert_config(pad_token_id=None), "tiny-bert")
    return saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "tiny-neox")


@pytest.fixture(scope="module", params=["bert", "gpt_neox", "checkpoint bert", "checkpoint gpt_neox"])
def tiny_run(request, tmp_path_factory):
    """A config-built init, or a saved checkpoint's own embedding table and first block (init `{name}@step0`)."""
    if request.param.startswith("checkpoint"):
        path = _saved_checkpoint(tmp_path_factory.mktemp("checkpoint"), request.param.split()[1])
        init = {"family": "local", "model": path.name, "step": 0}
        settings = UntrainedSettings(**{**TINY, "inits": [init]})
        tables = untrained.run(settings, progress=False, weights={f"{path.name}@step0": path})
        block = untrained.load_block(init, path)
    else:
        settings = UntrainedSettings(**{**TINY, "inits": [request.param]})
        tables = untrained.run(settings, progress=False)
        block = untrained.build_block(request.param, settings, settings.seed)
    x, direction = untrained.biased_inputs(block, settings, settings.seed)
    return settings, tables, block, x, direction


def test_every_number_against_brute_force(tiny_run):
    settings, tables, block, x, direction = tiny_run
    rows = tables["untrained"]
    for norm in settings.norms:
        biased = x + norm * direction
        bf = brute_force(block, biased)
        expected = expected_rows(bf, biased)
        got = rows.filter(pl.col("norm") == norm)
        assert got.height == len(expected) + block.geometry.n_heads + 1  # + entropy_norm_mean: its own test
        for (site, head, metric), value in expected.items():
            match = got.filter(
                (pl.col("site") == site)
                & (pl.col("metric") == metric)
                & (pl.col("head").is_null() if head is None else pl.col("head") == head)
            )
            assert match.height == 1, (site, head, metric)
            assert match["value"][0] == pytest.approx(value, rel=2e-4, abs=1e-6), (norm, site, head, metric)


def test_block_output_is_the_models_own(tiny_run):
    """The recorded output is the block's real output: the brute force reproduces what the model computes."""
    settings, _, block, x, direction = tiny_run
    biased = x + 10 * direction
    with torch.inference_mode():
        recorder = untrained.record(block, biased, settings)
    bf = brute_force(block, biased)
    out = recorder.vectors[(1, "resid")]
    assert float(out.sum_norm) / out.n == pytest.approx(float(bf["output"].norm(dim=-1).mean()), rel=1e-5)
    assert torch.allclose(out.sum_x, bf["output"].reshape(-1, bf["output"].shape[-1]).sum(0), rtol=1e-4, atol=1e-3)


def test_histogram_counts_against_brute_force(tiny_run):
    settings, tables, block, x, direction = tiny_run
    histogram = tables["histogram"]
    edges = [-math.inf, *settings.edges().tolist(), math.inf]
    for norm in settings.norms:
        bf = brute_force(block, x + norm * direction)
        got = histogram.filter(pl.col("norm") == norm)
        for h in range(block.geometry.n_heads):
            scores = bf["scores"][:, h][bf["visible"][:, h]].numpy()
            expected = [int(((scores >= lo) & (scores < hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])]
            counts = got.filter(pl.col("head") == h).sort("bin_lo")
            assert counts["count"].to_list() == expected
            assert counts["bin_lo"].to_list() == edges[:-1]
        b, t, n_heads = settings.n_sequences, settings.seq_len, block.geometry.n_heads
        pairs = t * t if not block.geometry.causal else t * (t + 1) // 2
        assert got["count"].sum() == b * n_heads * pairs


def test_every_table_has_the_schema_of_tables_py(tiny_run):
    tables = tiny_run[1]
    assert list(tables) == list(UNTRAINED_SCHEMAS)
    for name, df in tables.items():
        assert dict(df.schema) == UNTRAINED_SCHEMAS[name], name


def test_entropy_norm_and_summary(tiny_run):
    settings, tables, block, x, direction = tiny_run
    rows, summary = tables["untrained"], tables["summary"]
    bf = brute_force(block, x + direction)
    p, visible = bf["p"], bf["visible"]
    for h in range(block.geometry.n_heads):
        values = []
        for s in range(p.shape[0]):
            for i in range(p.shape[2]):
                row = p[s, h, i][visible[s, h, i]].numpy()
                if len(row) > 1:
                    values.append(-(row * np.log(row)).sum() / np.log(len(row)))
        got = rows.filter((pl.col("norm") == 1) & (pl.col("head") == h) & (pl.col("metric") == "entropy_norm_mean"))
        assert got["value"][0] == pytest.approx(np.mean(values), rel=1e-4)
    one_seed = summary.filter(pl.col("norm").is_not_null())
    assert (one_seed["n_seeds"] == 1).all() and (one_seed["mean"] == one_seed["min"]).all()


def test_fixed_point_interpolates_in_log_norm():
    norms = [0, 1, 10, 100]
    assert untrained.fixed_point(norms, norms, [5, 5, 5, 5]) == pytest.approx(5.0)
    assert untrained.fixed_point(norms, [1, 1, 10, 100], [3, 3, 3 * 10**0.5, 30]) == pytest.approx(9.0)
    assert untrained.fixed_point(norms, norms, [5, 5, 10, 50]) == pytest.approx(10.0)
    assert math.isnan(untrained.fixed_point(norms, norms, [200, 200, 200, 200]))


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_bias_drives_anisotropy_and_the_bert_fixed_point_is_inside_the_grid():
    """Godey Fig. 6: the output avg_cos rises toward 1 with N; BERT's block ends in a LayerNorm, so its output
    norm stays near sqrt(d_model) and the input norm crosses it inside the grid; several seeds spread."""
    settings = UntrainedSettings(
        inits=["bert"],
        n_sequences=2,
        seq_len=32,
        norms=[0, 0.1, 1, 10, 100, 1000],
        n_seeds=3,
        d_model=64,
        n_heads=4,
        d_ff=128,
        vocab_size=500,
    )
    tables = untrained.run(settings, progress=False)
    summary = tables["summary"]

    def mean(site, metric, norm):
        row = summary.filter(
            (pl.col("site") == site)
            & (pl.col("metric") == metric)
            & (pl.col("norm") == norm)
            & pl.col("head").is_null()
        )
        return row["mean"][0]

    assert mean("output", "avg_cos", 1000) > 0.95 > mean("output", "avg_cos", 0) + 0.5
    assert mean("output", "avg_cos", 0) >= mean("input", "avg_cos", 0) - 0.05
    assert mean("q", "avg_cos", 1000) > 0.9
    assert mean("attention", "p_max_mean", 1000) > mean("attention", "p_max_mean", 0)
    star = summary.filter(pl.col("metric") == "fixed_point_norm")
    assert star["n_seeds"][0] == 3 and star["std"][0] > 0
    assert 1 < star["min"][0] <= star["max"][0] < 100
    assert star["mean"][0] == pytest.approx(math.sqrt(64), rel=0.1)


def test_bad_settings_say_what_to_change():
    with pytest.raises(ValueError, match="unknown init"):
        UntrainedSettings(inits=["gpt2"])
    with pytest.raises(ValueError, match="multiple of n_heads"):
        UntrainedSettings(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="score_min < score_max"):
        UntrainedSettings(score_min=1.0, score_max=0.5)
    with pytest.raises(ValueError, match="unknown key"):
        UntrainedSettings.from_dict({"n_sequence": 4})
    with pytest.raises(ValueError, match="lists a bias norm more than once"):
        UntrainedSettings(norms=[0, 1, 1.0])  # a raw polars ComputeError (`item` got 2 values) in the run


@pytest.mark.slow  # over 10 s
def test_cli_writes_tables_and_figures(tmp_path):
    import json

    from anisweep.plots.untrained import UNTRAINED_FIGURES
    from anisweep.tables import UNTRAINED_TABLES

    settings = json.dumps({**TINY, "inits": ["bert", "gpt_neox"], "n_seeds": 2, "enabled": True})
    run = lambda *args: subprocess.run([sys.executable, "-m", "anisweep", *args], capture_output=True, text=True)  # noqa: E731
    done = run("untrained", "--settings", settings, "--out-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == sorted(f"{n}.parquet" for n in UNTRAINED_TABLES)
    done = run("plot-untrained", "--tables-dir", str(tmp_path), "--out-dir", str(tmp_path / "figures"))
    assert done.returncode == 0, done.stderr
    for name in UNTRAINED_FIGURES:
        assert (tmp_path / "figures" / name).stat().st_size > 10_000
    bad = run("untrained", "--settings", '{"inits": ["gpt2"]}', "--out-dir", str(tmp_path / "bad"))
    assert bad.returncode == 1 and "unknown init" in bad.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # over 10 s
@pytest.mark.parametrize("enabled", [False, True])
def test_rule_all_asks_for_the_figures_only_when_enabled(tmp_path, enabled):
    import yaml

    from conftest import snakemake_command

    config = {
        "models": [{"family": "toy", "name": "toy-bert", "steps": [0]}],
        "toy": {"toy-bert": {"arch": "bert", "steps": [0]}},
        "extract": {"seq_len": 64, "sample_tokens": 64},
        "untrained": {"enabled": enabled},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        snakemake_command(tmp_path, "-n", "--configfile", str(tmp_path / "config.yaml")), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    jobs = done.stdout + done.stderr
    assert ("plot_untrained" in jobs) is enabled and (
        "results/untrained/figures/untrained_norms.png" in jobs
    ) is enabled


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_checkpoint_init_is_the_checkpoints_own_embedding_and_first_block(tmp_path, arch):
    """The block's weights are the saved ones (not a fresh draw), its shape is the model's (not the settings'),
    and the tables carry the init's label."""
    from transformers import AutoModel

    path = _saved_checkpoint(tmp_path, arch)
    block = untrained.load_block({"family": "local", "model": path.name, "step": 0}, path)
    reference = AutoModel.from_pretrained(path)
    assert block.init == f"{path.name}@step0"
    assert torch.equal(block.embedding, reference.get_input_embeddings().weight)
    first = reference.encoder.layer[0] if arch == "bert" else reference.layers[0]
    ours, theirs = block.block.state_dict(), first.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert (block.geometry.d_model, block.geometry.n_heads) == (32, 4)
    settings = UntrainedSettings(**{**TINY, "inits": [{"model": path.name, "step": 0}], "norms": [0, 1]})
    x, _ = untrained.biased_inputs(block, settings, 0)
    assert x.shape == (settings.n_sequences, settings.seq_len, 32)
    manifest_dir = tmp_path / "weights"  # as fetch leaves it: a manifest naming the checkpoint's folder
    manifest_dir.mkdir()
    (manifest_dir / "checkpoint.json").write_text(json.dumps({"path": str(path)}))
    tables = untrained.run(settings, progress=False, weights={f"{path.name}@step0": manifest_dir})
    assert tables["untrained"]["init"].unique().to_list() == [f"{path.name}@step0"]
    direct = untrained.run(settings, progress=False, weights={f"{path.name}@step0": path})
    assert direct["untrained"].equals(tables["untrained"])


def test_checkpoint_init_needs_its_weights_and_its_keys():
    with pytest.raises(ValueError, match="no checkpoint folder.*toy-bert@step0"):
        untrained.run(UntrainedSettings(**{**TINY, "inits": [{"model": "toy-bert", "step": 0}]}), progress=False)
    with pytest.raises(ValueError, match="has the keys model"):
        UntrainedSettings(inits=[{"name": "toy-bert"}])
    with pytest.raises(ValueError, match="give `step: N`"):
        untrained.run(UntrainedSettings(**{**TINY, "inits": [{"model": "toy-bert"}]}), progress=False, weights={})


def test_checkpoint_inits_resolve_against_the_configs_models():
    from types import SimpleNamespace

    from anisweep import config
    from anisweep.errors import ConfigError
    from anisweep.mechanism.untrained_inits import resolve

    swept = [SimpleNamespace(family="toy", model="toy-bert", step=s) for s in (0, 4, 16)]
    swept += [SimpleNamespace(family="multiberts", model="seed_0", step=s) for s in (20000, 40000)]
    swept += [SimpleNamespace(family="local", model="seed_0", step=s) for s in (5, 9)]
    expected = ["bert", {"family": "toy", "model": "toy-bert", "step": 0}]
    assert resolve(["bert", {"model": "toy-bert"}], swept) == expected
    assert resolve([{"model": "toy-bert", "step": 16}], swept)[0]["step"] == 16
    earliest = resolve([{"model": "seed_0", "family": "multiberts"}], swept)[0]
    assert earliest == {"family": "multiberts", "model": "seed_0", "step": 20000}  # its earliest swept step
    with pytest.raises(ConfigError, match=r"not a model of this config's `models` \(toy/toy-bert"):
        resolve([{"model": "toy-neox"}], swept)
    with pytest.raises(ConfigError, match="step 3 is not a swept step of toy/toy-bert"):
        resolve([{"model": "toy-bert", "step": 3}], swept)
    with pytest.raises(ConfigError, match="several families.*add `family:`"):
        resolve([{"model": "seed_0"}], swept)
    with pytest.raises(ConfigError, match="named twice"):
        resolve([{"model": "toy-bert"}, {"model": "toy-bert", "step": 0}], swept)
    base = {"models": [{"family": "toy", "name": "toy-bert", "steps": [0]}]}
    assert config.complete({**base, "untrained": {"inits": ["bert", {"model": "toy-bert"}]}})
    for bad in (["gpt2"], [{"modle": "toy-bert"}], [{"model": "toy-bert", "step": -1}]):
        with pytest.raises(ConfigError, match="untrained.inits.0"):
            config.complete({**base, "untrained": {"inits": bad}})


@pytest.mark.slow  # over 10 s
def test_workflow_feeds_a_checkpoint_init_its_weights_and_stops_on_a_bad_one(tmp_path):
    import yaml

    from conftest import snakemake_command

    config = {
        "models": [{"family": "toy", "name": "toy-bert", "steps": [0, 2]}],
        "toy": {"toy-bert": {"arch": "bert", "steps": [0, 2]}},
        "extract": {"seq_len": 64, "sample_tokens": 64},
        "untrained": {"enabled": True, "inits": ["bert", {"model": "toy-bert"}]},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    args = ("-n", "-p", "--configfile", str(tmp_path / "config.yaml"))
    target = "results/untrained/untrained.parquet"
    done = subprocess.run(snakemake_command(tmp_path, target, *args), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = done.stdout + done.stderr
    assert "--weights=toy-bert@step0=weights/untrained/toy/toy-bert/step0" in jobs
    assert '{"family": "toy", "model": "toy-bert", "step": 0}' in jobs
    untrained_job = jobs.split("rule untrained:")[1].split("Shell command")[0]
    # its own copy of the weights (rule fetch_init): the sweep's model runs and this block never rerun each other
    assert "input: weights/untrained/toy/toy-bert/step0" in untrained_job
    assert "rule fetch_init:" in jobs
    config["untrained"]["inits"] = [{"model": "toy-bert", "step": 1}]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(snakemake_command(tmp_path, *args), capture_output=True, text=True)
    assert done.returncode != 0 and "step 1 is not a swept step of toy/toy-bert" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("family", "name"), [("tinyllama", "TinyLlama-1.1B"), ("olmo", "OLMo-1B-hf"), ("olmo2", "OLMo-2-0425-1B")]
)
def test_a_checkpoint_init_of_a_llama_style_model_is_refused_before_its_fetch(family, name):
    """Their adapters cannot run one block alone (no rotary module): the init used to wait for a 4.4 GB fetch,
    then fail with NotImplementedError."""
    from anisweep import config
    from anisweep.errors import ConfigError
    from anisweep.mechanism.untrained_inits import resolve

    done = config.complete({"models": [{"family": family, "name": name, "steps": "final"}]})
    with pytest.raises(ConfigError) as error:
        resolve(["bert", {"model": name}], config.checkpoints(done))
    message = str(error.value)
    assert f"{family}/{name} is a" in message and "cannot run alone" in message
    assert "pythia, multiberts, gpt2 and toy models, or a local run of model_type bert, gpt_neox, gpt2" in message


@pytest.mark.parametrize(
    ("model_type", "refused"), [("llama", True), ("olmo2", True), ("gpt2", False), ("bert", False)]
)
def test_a_local_runs_init_is_judged_by_its_config_json(tmp_path, model_type, refused):
    from types import SimpleNamespace

    from anisweep.errors import ConfigError
    from anisweep.mechanism.untrained_inits import resolve

    (tmp_path / "step0").mkdir()
    (tmp_path / "step0" / "config.json").write_text(json.dumps({"model_type": model_type}))
    swept = [SimpleNamespace(family="local", model="run", step=0, path=str(tmp_path / "step0"))]
    if not refused:
        assert resolve([{"model": "run"}], swept) == [{"family": "local", "model": "run", "step": 0}]
        return
    with pytest.raises(ConfigError, match=f"local/run is a {model_type} model"):
        resolve([{"model": "run"}], swept)


REPORT = Path(__file__).resolve().parents[2] / "workflow" / "report"


def test_score_std_is_float64_exact_where_the_float32_moments_cancel():
    """Scores shifted ~1500x their spread (a common bias through W_Q, W_K): sqrt(E[s^2] - E[s]^2) of float32 row
    sums, the streaming sweep's formula, is off by ~1e-3 relative; QKExtras' float64 two-pass moments agree
    with numpy float64 to 1e-9, in one sequence or merged across several, causal or not."""
    generator = torch.Generator().manual_seed(0)
    b, n_heads, t, d_head = 4, 2, 64, 16
    common = 3 * torch.randn(n_heads, 1, d_head, generator=generator)
    query = common + 0.005 * torch.randn(b, n_heads, t, d_head, generator=generator)
    key = common + 0.005 * torch.randn(b, n_heads, t, d_head, generator=generator)
    scaling = 1 / math.sqrt(d_head)
    for causal in (False, True):
        extras = untrained.QKExtras(n_heads, d_head, UntrainedSettings(**TINY).edges())
        for start in range(0, b, 3):  # two mini-batches of 3 and 1 sequences: the moments are merged
            part = slice(start, start + 3)
            extras.update(
                query[part], key[part], scaling, torch.ones(query[part].shape[0], t, dtype=torch.bool), causal
            )
        mean, std = extras.score_moments()
        visible = torch.ones(t, t, dtype=torch.bool).tril() if causal else torch.ones(t, t, dtype=torch.bool)
        s32 = torch.matmul(query, key.transpose(-1, -2)) * scaling  # the float32 scores the histogram counts
        for h in range(n_heads):
            expected = (query[:, h].double() @ key[:, h].double().transpose(-1, -2) * scaling)[:, visible].numpy()
            assert float(mean[h]) == pytest.approx(expected.mean(), rel=1e-7)
            # numpy float64 of the float32 scores QKExtras sees: to rounding; of float64 q.k: to the scores' rounding
            assert float(std[h]) == pytest.approx(s32[:, h][:, visible].double().numpy().std(), rel=1e-9)
            assert float(std[h]) == pytest.approx(expected.std(), rel=1e-5)
            assert expected.mean() / expected.std() > 500
            # the old formula on the same float32 scores: float32 sums per row, float64 across rows
            rows = s32[:, h].masked_fill(~visible, 0.0)
            n = int(visible.sum()) * b
            old_mean = float(rows.sum(-1).double().sum()) / n
            old_sq = float(torch.linalg.vector_norm(rows, dim=-1).double().square().sum()) / n
            old = math.sqrt(max(old_sq - old_mean**2, 0.0))
            assert abs(old / expected.std() - 1) > 2e-4  # what the float64 two-pass sums fix


def _avg_cos_in_out(rows: pl.DataFrame) -> pl.DataFrame:
    return (
        rows.filter(
            pl.col("head").is_null() & (pl.col("metric") == "avg_cos") & pl.col("site").is_in(["input", "output"])
        )
        .pivot("site", index=["init", "seed", "norm"], values="value")
        .sort("init", "seed", "norm")
    )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_the_norms_caption_says_what_the_tables_show(tmp_path):
    """untrained_norms.rst's claims against tables computed here: at initialisation the output avg_cos follows
    the input's within the caption's bound at every N, above or below (no `at or above`), both rise toward 1;
    the post-LayerNorm block's output norm is sqrt(d_model) at every N (gain 1, bias 0), so N* lies just below
    sqrt(d_model); a checkpoint init with non-trivial LayerNorm parameters does not hold its output at sqrt(d_model)."""
    caption = (REPORT / "untrained_norms.rst").read_text()
    assert "at or above" not in caption
    bound = float(re.search(r"avg_cos follows the input's within (\d\.\d+) at every N", caption).group(1))
    assert "gain 1 and bias 0" in caption and "pre-LayerNorm block" in caption

    path = _saved_checkpoint(tmp_path, "bert")
    init = {"family": "local", "model": path.name, "step": 0}
    settings = UntrainedSettings(
        inits=["bert", init],
        n_sequences=2,
        seq_len=32,
        norms=[0, 0.1, 0.3, 1, 3, 10, 30, 100],
        n_seeds=3,
        d_model=64,
        n_heads=4,
        d_ff=128,
        vocab_size=500,
    )
    tables = untrained.run(settings, progress=False, weights={f"{path.name}@step0": path})
    cos = _avg_cos_in_out(tables["untrained"]).with_columns(diff=pl.col("output") - pl.col("input"))
    assert (cos.filter(pl.col("init") == "bert")["diff"].abs() < bound).all()
    biased = cos.filter(pl.col("norm") > 0)
    assert (biased["diff"] < 0).any() and (biased["diff"] > 0).any()  # above or below: neither always
    top = cos.filter(pl.col("norm") == 100)
    assert (top["input"] > 0.99).all() and (top["output"] > 0.99).all()

    summary = tables["summary"]
    norms = summary.filter(
        (pl.col("site") == "output") & (pl.col("metric") == "norm_mean") & pl.col("head").is_null()
    ).filter(pl.col("norm").is_not_null())
    forced = norms.filter(pl.col("init") == "bert")
    assert np.allclose(forced["min"].to_numpy(), 8.0, rtol=1e-4) and np.allclose(forced["max"], 8.0, rtol=1e-4)
    star = summary.filter((pl.col("init") == "bert") & (pl.col("metric") == "fixed_point_norm"))
    assert 0.9 * 8.0 < star["min"][0] <= star["max"][0] < 8.0 * 1.001
    trained_ln = norms.filter(pl.col("init") == f"{path.name}@step0")
    assert not np.allclose(trained_ln["mean"].to_numpy(), math.sqrt(16), rtol=1e-3)


def test_score_figure_folds_scores_onto_their_magnitude_by_sign(tmp_path):
    """The histogram folded onto |score|: a symmetric histogram gives equal positive and negative curves, the
    shares (curves, the central bin, the open-ended bins) add up to 1, and the figure is written."""
    from anisweep.plots.untrained import score_magnitudes, scores

    settings = UntrainedSettings(**TINY)
    edges = [-math.inf, *settings.edges().tolist(), math.inf]
    rng = np.random.default_rng(0)
    rows = []
    for norm, scale, shift in ((0.0, 0.03, 0.0), (10.0, 0.3, 0.5)):
        values = rng.normal(shift, scale, 20_000)
        counts, _ = np.histogram(values, bins=np.array(edges))
        for head in (0, 1):
            rows += [
                {
                    "init": "bert",
                    "seed": 0,
                    "norm": norm,
                    "layer": 0,
                    "head": head,
                    "bin_lo": lo,
                    "bin_hi": hi,
                    "count": int(c),
                }
                for lo, hi, c in zip(edges[:-1], edges[1:], counts)
            ]
    histogram = pl.DataFrame(rows, schema=UNTRAINED_SCHEMAS["histogram"])
    folded = score_magnitudes(histogram)
    for _, part in folded.group_by("norm"):
        total = part["positive"].sum() + part["negative"].sum() + part["small"][0] + part["beyond"][0]
        assert total == pytest.approx(1.0)
        assert (part["bin_lo"] > 0).all()
    centred = folded.filter(pl.col("norm") == 0.0)
    assert np.abs(centred["positive"] - centred["negative"]).max() < 0.02  # zero-centred: the curves coincide
    shifted = folded.filter(pl.col("norm") == 10.0)
    assert shifted["positive"].sum() > 0.9  # shifted positive: the negative curve is near empty
    scores(histogram, tmp_path / "untrained_scores.png")
    assert (tmp_path / "untrained_scores.png").stat().st_size > 10_000


def test_untrained_captions_are_valid_restructuredtext():
    """Snakemake's report renders the captions with docutils: none may raise a warning or error (`|score|` was
    read as an undefined substitution reference)."""
    import io

    from docutils.core import publish_doctree

    for caption in sorted(REPORT.glob("untrained_*.rst")):
        messages = io.StringIO()
        publish_doctree(caption.read_text(), settings_overrides={"warning_stream": messages, "report_level": 2})
        assert messages.getvalue() == "", (caption.name, messages.getvalue())
