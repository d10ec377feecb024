"""The untrained Transformer block with an injected common bias (Godey et al. 2024, Section 4.1, Fig. 6-10).

An embedding table E and ONE Transformer block, either both initialised by the architecture's own `_init_weights`
(a 1-layer BertModel or GPTNeoXModel built from a config: inits `bert`, `gpt_neox`) or a swept checkpoint's own
input embedding table and first block with their real weights (an init such as `toy-bert@step0`, loaded as
extract loads it; anisweep.mechanism.untrained_inits); B sequences of T tokens drawn uniformly from E; a
bias b = N u/||u||, u ~ N(0, I), added to every token; the block run on x + b for each N of a grid, for
several seeds of the initialisation, of u and of the tokens.

The block runs through extract's recording attention and hooks (anisweep.extract.recorder), so its q/k norms and
attention statistics are the sweep's own definitions. What the sweep does not record is kept here, by a
Recorder subclass: the unit-vector sums of q and k (their avg_cos), a histogram of the pre-softmax scores
in fixed bins (exact counts over every visible pair), and each sequence's extreme probabilities.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from anisweep import schema
from anisweep.extract.attention_torch import Workers
from anisweep.extract.recorder import ATTENTION_NAME, Hooks, Recorder, Sample, recording, register_attention
from anisweep.extract.streaming import ROW_FIELDS, AttentionStats
from anisweep.measures.geometry import avg_cos_from_sums, drift_from_sums
from anisweep.mechanism.untrained_inits import CONFIG_INITS, is_checkpoint_init, label
from anisweep.tables import UNTRAINED_SCHEMAS

INITS = CONFIG_INITS
CHECKPOINT_INIT_KEYS = {"model", "family", "step"}
_DEFAULTS = schema.defaults("untrained")


@dataclass
class UntrainedSettings:
    """The config's `untrained` section; the defaults are the schema's (anisweep/config.schema.yaml)."""

    enabled: bool = _DEFAULTS["enabled"]
    inits: list[str | dict] = field(default_factory=lambda: list(_DEFAULTS["inits"]))
    n_sequences: int = _DEFAULTS["n_sequences"]
    seq_len: int = _DEFAULTS["seq_len"]
    batch_size: int = _DEFAULTS["batch_size"]
    norms: list[float] = field(default_factory=lambda: list(_DEFAULTS["norms"]))
    n_seeds: int = _DEFAULTS["n_seeds"]
    seed: int = _DEFAULTS["seed"]
    d_model: int = _DEFAULTS["d_model"]
    n_heads: int = _DEFAULTS["n_heads"]
    d_ff: int = _DEFAULTS["d_ff"]
    vocab_size: int = _DEFAULTS["vocab_size"]
    score_min: float = _DEFAULTS["score_min"]
    score_max: float = _DEFAULTS["score_max"]
    bins_per_decade: int = _DEFAULTS["bins_per_decade"]

    def __post_init__(self):
        unknown = [i for i in self.inits if not is_checkpoint_init(i) and i not in INITS]
        if unknown:
            raise ValueError(
                f"untrained.inits: unknown init(s) {unknown}; expected some of {', '.join(INITS)}, "
                "or a swept model's earliest checkpoint as {model: NAME}"
            )
        for init in filter(is_checkpoint_init, self.inits):
            if "model" not in init or set(init) - CHECKPOINT_INIT_KEYS:
                raise ValueError(
                    f"untrained.inits: {init}: a checkpoint init has the keys model (required), family and step"
                )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"untrained: d_model {self.d_model} is not a multiple of n_heads {self.n_heads}; change either"
            )
        if any(n < 0 for n in self.norms):
            raise ValueError(f"untrained.norms: bias norms must be >= 0, got {self.norms}")
        if len(set(self.norms)) < len(self.norms):
            raise ValueError(f"untrained.norms: {self.norms} lists a bias norm more than once; list each once")
        if not 0 < self.score_min < self.score_max:
            raise ValueError(f"untrained: need 0 < score_min < score_max, got {self.score_min}, {self.score_max}")
        self.norms = sorted(float(n) for n in self.norms)

    @classmethod
    def from_dict(cls, section: dict) -> UntrainedSettings:
        """The config's `untrained` section (keys it leaves out take the schema's defaults)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"untrained: unknown key(s) {unknown}; valid: {sorted(known)}")
        return cls(**section)

    def edges(self) -> torch.Tensor:
        """The score histogram's fixed bin edges, symmetric and log-spaced in |score| (scores span orders of
        magnitude across N): -score_max ... -score_min, score_min ... score_max, bins_per_decade per decade,
        one bin [-score_min, score_min) in the middle; scores beyond +-score_max land in two open-ended bins."""
        n = max(1, round(math.log10(self.score_max / self.score_min) * self.bins_per_decade))
        magnitudes = torch.logspace(math.log10(self.score_min), math.log10(self.score_max), n + 1, dtype=torch.float64)
        return torch.cat([-magnitudes.flip(0), magnitudes])


# --------------------------------------------------------------------------- the block


@dataclass
class Block:
    """An embedding table and one initialised Transformer block (the base model's first), ready to run through
    the recorder."""

    init: str  # its label: `bert`, `gpt_neox`, or `toy-bert@step0`
    model: torch.nn.Module  # the base model the block belongs to (the Hooks' sites are its modules)
    embedding: torch.Tensor  # (V, d)
    adapter: object
    geometry: object

    @property
    def block(self) -> torch.nn.Module:
        return self.adapter.resid_sites(self.model)[1].module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output on input vectors x (B, T, d), with no embedding, position or final LayerNorm."""
        if self.geometry.rotary_dims:
            positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
            cos_sin = self.adapter.rotary_embedding(self.model)(x, positions)
            output = self.block(x, position_embeddings=cos_sin, position_ids=positions)
        else:
            output = self.block(x)
        return output[0] if isinstance(output, (tuple, list)) else output


def build_block(init: str, settings: UntrainedSettings, seed: int) -> Block:
    """A 1-layer BertModel or GPTNeoXModel built from a config by transformers, so its weights are the
    model's own `_init_weights` draw (normal(0, initializer_range) for Linear and Embedding weights,
    LayerNorm gain 1 and bias 0), seeded; with the recording attention."""
    import transformers

    from anisweep.adapters import adapter_for

    register_attention()
    shape = {
        "vocab_size": settings.vocab_size,
        "hidden_size": settings.d_model,
        "num_hidden_layers": 1,
        "num_attention_heads": settings.n_heads,
        "intermediate_size": settings.d_ff,
        "max_position_embeddings": max(512, settings.seq_len),
    }
    if init == "bert":
        cfg = transformers.BertConfig(**shape, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        cls, kwargs = transformers.BertModel, {"add_pooling_layer": False}
    elif init == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            **shape,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            use_parallel_residual=True,
            attention_bias=True,
        )
        cls, kwargs = transformers.GPTNeoXModel, {}
    else:
        raise ValueError(f"unknown init {init!r}; expected one of {', '.join(INITS)}")
    cfg._attn_implementation = ATTENTION_NAME
    torch.manual_seed(seed)
    model = cls(cfg, **kwargs).eval()
    adapter = adapter_for(model.config)
    return Block(init, model, model.get_input_embeddings().weight.detach(), adapter, adapter.geometry(model.config))


def checkpoint_folder(path) -> Path:
    """The folder holding a checkpoint's weights: `path` itself, or where the manifest fetch wrote into `path`
    (weights/{family}/{model}/step{N}/checkpoint.json) says they are."""
    from anisweep.checkpoints.fetch import MANIFEST

    manifest = Path(path) / MANIFEST
    return Path(json.loads(manifest.read_text())["path"]) if manifest.is_file() else Path(path)


def load_block(init: dict, path) -> Block:
    """A swept checkpoint's own input embedding table and first Transformer block, with their real weights,
    loaded as extract loads a checkpoint (float32, CPU, the recording attention); the block's shape is the
    model's. The model's other blocks are loaded but never run. `path`: a checkpoint folder, or a folder
    fetch wrote its manifest into."""
    from anisweep.extract.model import load_model

    loaded = load_model(checkpoint_folder(path), dtype="float32", device="cpu")
    embedding = loaded.adapter.embedding_matrices(loaded.model)["embed_in"].detach()
    return Block(label(init), loaded.base, embedding, loaded.adapter, loaded.geometry)


# --------------------------------------------------------------------------- what the Recorder lacks


class ExtremeAttentionStats(AttentionStats):
    """AttentionStats that also keep, per sequence and head, the largest and smallest probability over its
    valid query rows with more than one visible key (Godey Fig. 10; a causal block's first row sees only
    itself, p = 1), from the same per-row statistics the means are taken of."""

    def __init__(self, n_heads: int, device: torch.device | str = "cpu"):
        super().__init__(n_heads, device)
        self.seq_max: list[torch.Tensor] = []  # (B, H) per mini-batch
        self.seq_min: list[torch.Tensor] = []

    def update(self, rows, valid, n_visible, counts=None) -> None:
        super().update(rows, valid, n_visible, counts)
        keep = (valid & (n_visible > 1))[:, None, :]
        p_max = rows[..., ROW_FIELDS.index("p_max")].double()
        p_min = rows[..., ROW_FIELDS.index("p_min")].double()
        self.seq_max.append(torch.where(keep, p_max, -math.inf).amax(dim=2).cpu())
        self.seq_min.append(torch.where(keep, p_min, math.inf).amin(dim=2).cpu())

    def extremes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(max, min), each (n_sequences, H)."""
        return torch.cat(self.seq_max), torch.cat(self.seq_min)


class QKExtras:
    """Per head: the sums of unit q and unit k vectors over valid tokens (for avg_cos), the counts of
    the pre-softmax scores q.k * scaling of every visible (query, key) pair in fixed bins, with one
    open-ended bin below the first edge and one above the last, and the mean and standard deviation of those
    scores, accumulated in float64 without cancellation: per sequence a two-pass mean and sum of squared
    deviations, merged across sequences by Chan et al.'s pairwise update (sqrt(E[s^2] - E[s]^2) of float32
    row sums would lose ~1e-3 relative when a bias shifts every score by ~100 times their spread)."""

    def __init__(self, n_heads: int, d_head: int, edges: torch.Tensor):
        self.edges = edges
        self.n = 0
        self.q_unit = torch.zeros(n_heads, d_head, dtype=torch.float64)
        self.k_unit = torch.zeros(n_heads, d_head, dtype=torch.float64)
        self.counts = torch.zeros(n_heads, len(edges) + 1, dtype=torch.int64)
        self.score_n = torch.zeros(n_heads, dtype=torch.float64)
        self.score_mean = torch.zeros(n_heads, dtype=torch.float64)
        self.score_m2 = torch.zeros(n_heads, dtype=torch.float64)  # sum of squared deviations from the mean

    def _add_scores(self, scores: torch.Tensor, visible: torch.Tensor) -> None:
        """Merge one sequence's visible scores (H, T, T), visible (H, T, T), into the float64 moments."""
        s = scores.double().cpu()
        visible = visible.cpu()
        n = visible.sum(dim=(1, 2)).double()
        mean = torch.where(visible, s, 0.0).sum(dim=(1, 2)) / n.clamp_min(1)
        m2 = torch.where(visible, (s - mean[:, None, None]).square(), 0.0).sum(dim=(1, 2))
        total = self.score_n + n
        delta = mean - self.score_mean
        share = n / total.clamp_min(1)
        self.score_m2 += m2 + delta.square() * self.score_n * share
        self.score_mean += delta * share
        self.score_n = total

    def score_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, population std) per head of every visible pair's score, float64."""
        return self.score_mean, (self.score_m2 / self.score_n.clamp_min(1)).sqrt()

    def update(self, query, key, scaling: float, valid: torch.Tensor, causal: bool) -> None:
        """query, key: (B, H, T, d_head); valid: (B, T)."""
        self.n += int(valid.sum())
        for total, x in ((self.q_unit, query.float()), (self.k_unit, key.float())):
            # as streaming's sums: float32 within the mini-batch, float64 across
            weights = valid[:, None, :].float() / torch.linalg.vector_norm(x, dim=-1).clamp_min(1e-30)
            total += torch.einsum("bht,bhtd->hd", weights, x).double()
        t, n_heads, width = query.shape[2], query.shape[1], self.counts.shape[1]
        edges = self.edges.to(query.device, torch.float32)
        offsets = (torch.arange(n_heads, device=query.device) * width)[:, None, None]
        for seq in range(query.shape[0]):  # one sequence's scores at a time: H x T x T floats
            visible = valid[seq][:, None] & valid[seq][None, :]
            if causal:
                visible = visible & torch.ones(t, t, dtype=torch.bool, device=visible.device).tril()
            scores = torch.matmul(query[seq].float(), key[seq].float().transpose(-1, -2)) * scaling
            bins = torch.bucketize(scores, edges, right=True) + offsets  # 0: below edges[0]; len(edges): above
            selected = bins[visible.expand(n_heads, -1, -1)]
            self.counts += torch.bincount(selected, minlength=n_heads * width).view(n_heads, width).cpu()
            self._add_scores(scores, visible.expand(n_heads, -1, -1))


@dataclass
class BlockRecorder(Recorder):
    """The sweep's Recorder, plus QKExtras and ExtremeAttentionStats."""

    edges: torch.Tensor | None = None

    def __post_init__(self):
        super().__post_init__()
        g = self.geometry
        self.attention = {layer: ExtremeAttentionStats(g.n_heads, self.device) for layer in range(g.n_layers)}
        self.extras = {layer: QKExtras(g.n_heads, g.d_head, self.edges) for layer in range(g.n_layers)}

    def attend(self, layer, query, key, value, scaling, bias=None, cross=False) -> torch.Tensor:
        self.extras[layer].update(query, key, scaling, self.valid, self.geometry.causal)
        return super().attend(layer, query, key, value, scaling, bias=bias, cross=cross)


# --------------------------------------------------------------------------- one run


def biased_inputs(block: Block, settings: UntrainedSettings, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, u): B x T token vectors drawn uniformly (with replacement) from the embedding table, and the unit
    bias direction u/||u||, u ~ N(0, I_d); both seeded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(block.embedding.shape[0], (settings.n_sequences, settings.seq_len), generator=generator)
    u = torch.randn(block.embedding.shape[1], generator=generator, dtype=torch.float64)
    return block.embedding[ids], (u / torch.linalg.vector_norm(u)).to(block.embedding.dtype)


@torch.inference_mode()
def record(block: Block, x: torch.Tensor, settings: UntrainedSettings) -> BlockRecorder:
    """Run the block on x (B, T, d) in mini-batches through the recording attention and the sweep's hooks;
    the input is recorded as resid layer 0, the block's output is resid layer 1 (its hook)."""
    valid = torch.ones(x.shape[:2], dtype=torch.bool)
    sample = Sample.draw(torch.zeros(x.shape[:2], dtype=torch.long), valid, 0, 0)  # no tokens kept whole
    workers = Workers(torch.get_num_threads())
    recorder = BlockRecorder(block.geometry, sample, torch.device("cpu"), workers, edges=settings.edges())
    try:
        with recording(recorder), Hooks(block.adapter, block.model, block.geometry, recorder):
            for start in range(0, x.shape[0], settings.batch_size):
                part = x[start : start + settings.batch_size]
                recorder.begin_batch(valid[start : start + settings.batch_size], start)
                recorder.record_vectors(0, "resid", part)
                block.forward(part)
    finally:
        workers.close()
    return recorder


def _vector_rows(stats, site: str) -> list[dict]:
    drift_norm, _ = drift_from_sums(stats.sum_x.cpu().numpy(), stats.sum_norm, stats.n)
    return [
        {
            "site": site,
            "metric": "avg_cos",
            "value": avg_cos_from_sums(stats.sum_unit.cpu().numpy(), stats.n - stats.n_zero),
        },
        {"site": site, "metric": "norm_mean", "value": stats.sum_norm / max(stats.n, 1)},
        {"site": site, "metric": "drift_norm", "value": drift_norm},
    ]


def _with_head_mean(rows: list[dict]) -> list[dict]:
    """Per-head rows plus, per (site, metric), their mean over heads with head null."""
    means = {}
    for r in rows:
        means.setdefault((r["site"], r["metric"]), []).append(r["value"])
    return rows + [
        {"layer": 0, "head": None, "site": site, "metric": metric, "value": float(np.mean(values))}
        for (site, metric), values in means.items()
    ]


def recorder_rows(recorder: BlockRecorder) -> list[dict]:
    """Tidy rows (layer, head, site, metric, value) of one run: input/output (Fig. 6), q/k (Fig. 8), the
    attention statistics (Fig. 9) and per-sequence extremes (Fig. 10). head null: the mean over heads, except
    seq_p_max_mean / seq_p_min_mean, the extremes over every head and row of a sequence, averaged over sequences."""
    rows = []
    for site, layer in (("input", 0), ("output", 1)):
        rows += [{"layer": None, "head": None, **r} for r in _vector_rows(recorder.vectors[(layer, "resid")], site)]
    rope = "post" if recorder.geometry.rotary_dims else "pre"
    extras = recorder.extras[0]
    per_head = []
    for site, stats, unit in (("q", recorder.q[(0, rope)], extras.q_unit), ("k", recorder.k[(0, rope)], extras.k_unit)):
        for h in range(recorder.geometry.n_heads):
            drift_norm, _ = drift_from_sums(stats.sum_x[h].cpu().numpy(), float(stats.sum_norm[h]), stats.n)
            values = {
                "avg_cos": avg_cos_from_sums(unit[h].numpy(), extras.n),
                "norm_mean": float(stats.sum_norm[h]) / max(stats.n, 1),
                "drift_norm": drift_norm,
            }
            per_head += [{"layer": 0, "head": h, "site": site, "metric": m, "value": v} for m, v in values.items()]
    attention = recorder.attention[0]
    seq_max, seq_min = attention.extremes()
    means = attention.means()
    # the score moments from QKExtras' float64 sums of the scores themselves
    means["score_mean"], means["score_std"] = extras.score_moments()
    for name, values in means.items():
        per_head += [
            {"layer": 0, "head": h, "site": "attention", "metric": name, "value": float(v)}
            for h, v in enumerate(values)
        ]
    for name, values in (("seq_p_max_mean", seq_max.mean(dim=0)), ("seq_p_min_mean", seq_min.mean(dim=0))):
        per_head += [
            {"layer": 0, "head": h, "site": "attention", "metric": name, "value": float(v)}
            for h, v in enumerate(values)
        ]
    rows += _with_head_mean(per_head)
    for row in rows:  # the head mean of per-head extremes is replaced by the extremes over all heads
        if row["head"] is None and row["metric"] == "seq_p_max_mean":
            row["value"] = float(seq_max.amax(dim=1).mean())
        if row["head"] is None and row["metric"] == "seq_p_min_mean":
            row["value"] = float(seq_min.amin(dim=1).mean())
    return rows


def histogram_rows(recorder: BlockRecorder) -> list[dict]:
    edges = [-math.inf, *recorder.extras[0].edges.tolist(), math.inf]
    rows = []
    for h, counts in enumerate(recorder.extras[0].counts.tolist()):
        rows += [
            {"layer": 0, "head": h, "bin_lo": lo, "bin_hi": hi, "count": c}
            for lo, hi, c in zip(edges[:-1], edges[1:], counts)
        ]
    return rows


def fixed_point(norms, input_norm, output_norm) -> float:
    """The bias norm N* > 0 where the mean input and output norms meet: the first sign change of
    log(output) - log(input) over the positive grid, interpolated linearly in log N (exact where both norms
    follow power laws of N between two grid points, as a LayerNorm's constant output and an input ~ N do).
    NaN when they do not cross on the grid. For a post-LayerNorm block N* is forced by the final LayerNorm:
    with gain 1 and bias 0 every output has norm sqrt(d), so N* ~ sqrt(d - E||x||^2) - <mean x, u>, just below
    sqrt(d); with trained LayerNorm parameters or a pre-LayerNorm block it need not be near sqrt(d)."""
    grid = [(n, math.log(o) - math.log(i)) for n, i, o in zip(norms, input_norm, output_norm) if n > 0]
    for (n0, d0), (n1, d1) in zip(grid, grid[1:]):
        if d0 == 0:
            return float(n0)
        if (d0 < 0) != (d1 < 0) or d1 == 0:
            t = d0 / (d0 - d1)
            return float(math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))))
    return float("nan")


def _fixed_point_rows(rows: pl.DataFrame) -> list[dict]:
    out = []
    for (init, seed), part in rows.group_by(["init", "seed"], maintain_order=True):
        in_out = (pl.col("metric") == "norm_mean") & pl.col("site").is_in(["input", "output"])
        norm = part.filter(in_out).pivot("site", index="norm", values="value").sort("norm")
        value = fixed_point(norm["norm"].to_list(), norm["input"].to_list(), norm["output"].to_list())
        out.append(
            {"init": init, "seed": seed, "norm": None, "layer": None, "head": None, "site": "output"}
            | {"metric": "fixed_point_norm", "value": value}
        )
    return out


def summary(rows: pl.DataFrame) -> pl.DataFrame:
    """The spread over seeds of every (init, norm, layer, head, site, metric): mean, std (ddof 1), min, max."""
    keys = ["init", "norm", "layer", "head", "site", "metric"]
    return (
        rows.group_by(keys, maintain_order=True)
        .agg(
            pl.col("value").mean().alias("mean"),
            pl.col("value").std().alias("std"),
            pl.col("value").min().alias("min"),
            pl.col("value").max().alias("max"),
            pl.col("value").is_not_nan().sum().alias("n_seeds"),
        )
        .sort(keys, nulls_last=True)
    )


def run(settings: UntrainedSettings, progress: bool = True, weights: dict | None = None) -> dict[str, pl.DataFrame]:
    """Every init x seed x bias norm: the tidy metric rows, the score histograms and the spread over seeds.
    `weights` maps each checkpoint init's label (`toy-bert@step0`) to its checkpoint folder; a checkpoint init's
    weights are the same for every seed, which then draws the tokens and the bias direction only."""
    weights = weights or {}
    missing = [label(i) for i in settings.inits if is_checkpoint_init(i) and label(i) not in weights]
    if missing:
        raise ValueError(f"untrained: no checkpoint folder for init(s) {missing}; give --weights LABEL=PATH")
    rows, histograms = [], []
    jobs = [(init, i) for init in settings.inits for i in range(settings.n_seeds)]
    loaded = {label(i): load_block(i, weights[label(i)]) for i in settings.inits if is_checkpoint_init(i)}
    bar = tqdm(total=len(jobs) * len(settings.norms), desc="untrained", unit="run", disable=not progress)
    for init, i in jobs:
        seed = settings.seed + i
        block = loaded[label(init)] if is_checkpoint_init(init) else build_block(init, settings, seed)
        x, direction = biased_inputs(block, settings, seed)
        for norm in settings.norms:
            recorder = record(block, x + norm * direction, settings)
            ident = {"init": block.init, "seed": seed, "norm": norm}
            rows += [ident | r for r in recorder_rows(recorder)]
            histograms += [ident | r for r in histogram_rows(recorder)]
            bar.update()
    bar.close()
    schema = UNTRAINED_SCHEMAS["untrained"]
    table = pl.DataFrame(rows, schema=schema)
    table = pl.concat([table, pl.DataFrame(_fixed_point_rows(table), schema=schema)])
    return {
        "untrained": table,
        "histogram": pl.DataFrame(histograms, schema=UNTRAINED_SCHEMAS["histogram"]),
        "summary": summary(table),
    }
