"""What every name in metrics.parquet means: each metric, each site and each column, with a one-line definition
and the work it comes from, and every status word the sweep and the audit write, each with one meaning.
docs/metrics.md is `glossary_markdown()` (a test keeps them equal); rewrite it with

    python -m anisweep.measures.glossary            # writes docs/metrics.md (run from the repository root)
    python -m anisweep.measures.glossary OUT.md     # or anywhere else

A test builds metrics.parquet for tiny checkpoints (with the gradient analysis) and checks that every metric and
site written there is listed here, at a site listed for it: a new metric or site needs its entry.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from anisweep.measures.geometry import SPREAD_TOLERANCE
from anisweep.measures.logged import LOGGED, LOGGED_MEASURES, scalar_name
from anisweep.measures.sites import (
    HIDDEN_SITES,
    SAMPLED_SITES,
)

__all__ = [
    "COLUMNS",
    "COMPARE_COLUMNS",
    "COMPARE_METRICS",
    "METRICS",
    "PHASES",
    "PHASE_COLUMNS",
    "SITES",
    "STATUSES",
    "Status",
    "Term",
    "column_names",
    "glossary_markdown",
    "metric_names",
    "site_names",
    "status_names",
    "write_docs",
]

# Sources, as the docs cite them.
GODEY = "Godey et al. 2024"
MACHINA = "Machina & Mercer 2024"
ETHAYARAJH = "Ethayarajh 2019"
ISOSCORE = "Rudman et al. 2022 (IsoScore)"
MU = "Mu & Viswanath 2018"
BIS = "Biś et al. 2021"
MOLINA = "Molina 2023 (Traveling Words)"
TANGENT = "Revisiting Anisotropy in Language Transformers (tangent-aligned anisotropy)"
TIMKEY = "Timkey & van Schijndel 2021 (rogue dimensions)"
SUN = "Sun et al. 2024 (massive activations)"
XIAO = "Xiao et al. 2024 (attention sinks)"
KOVALEVA = "Kovaleva et al. 2021 (LayerNorm outlier dimensions)"
GARRIDO = "Garrido et al. 2023 (RankMe)"
ALPHA_REQ = (
    "Agrawal et al. 2022 (alpha-ReQ), fitted as Li et al. 2025 (arXiv 2509.23024) fit it:"
    " melodylizx/Tracing-the-representation-geometry-of-language-models@c9b6f82, utils/powerlaw.py"
)
RANKME_COV = (
    "Garrido et al. 2023 (RankMe), computed as Li et al. 2025 (arXiv 2509.23024) compute it:"
    " melodylizx/Tracing-the-representation-geometry-of-language-models@c9b6f82, utils/powerlaw.py"
)
PICO = "pico-lm/pico-analyze@c4a4e84, src/metrics/"
GU = "Gu et al. 2024 (When Attention Sink Emerges): sail-sg/Attention-Sink@af49727, eval_sink_open_source.py"
ANISWEEP = "anisweep"


@dataclass(frozen=True)
class Term:
    """One name of metrics.parquet: `definition` in one line, `source` the work it comes from ("anisweep": this
    pipeline's own), and for a metric the `sites` whose rows carry it."""

    name: str
    definition: str
    source: str
    sites: tuple[str, ...] = ()


# --------------------------------------------------------------------------- sites
#: Sites of the norms' own parameters (layernorm.parquet).
NORM_SITES = (
    "ln_embed",
    "ln_attn",
    "ln_mlp",
    "ln_attn_post",
    "ln_mlp_post",
    "ln_cross",
    "encoder_final_ln",
    "stage_ln",
    "final_ln",
)
#: `qk_{rope}`: where the queries and keys are read (qk.parquet's rope).
QK_SITES = ("qk_pre", "qk_post", "qk_pre_norm")
#: The queries and keys kept whole for a token sample (qk_sample.parquet): not those before a q/k norm.
QK_SAMPLE_SITES = ("qk_pre", "qk_post")
EMBEDDING_SITES = ("embed_in", "embed_out")
#: Sites of the weight matrices (measures.matrices): each block's W_Q, W_K, W_V, W_O, the embedding and unembedding.
WEIGHT_MATRIX_SITES = ("w_q", "w_k", "w_v", "w_o", "embed_in", "embed_out")
#: Sites of the gradient analysis (anisweep.tangent.backward.gradient_sites).
GRADIENT_SITES = ("resid", "final_ln_in", "final_ln_out")

_LN_IO = (
    "input (`_in`) or output (`_out`, with gain and bias) of the norm of the same name, `layer` as for its parameters"
)

SITES: tuple[Term, ...] = (
    Term("resid", "the residual stream after `layer` blocks (0 = the embedding output, l = block l's output)", GODEY),
    Term(
        "final_ln_in",
        "the residual stream just before the final LayerNorm (Pythia `final_layer_norm`; BERT: the last block's output"
        " LayerNorm), `layer` = number of blocks",
        MACHINA,
    ),
    Term("final_ln_out", "the output of the final LayerNorm (with gain and bias), `layer` = number of blocks", MACHINA),
    Term("ln_embed_in", f"BERT's embedding LayerNorm: {_LN_IO}", MOLINA),
    Term("ln_embed_out", f"BERT's embedding LayerNorm: {_LN_IO}", MOLINA),
    Term("ln_attn_in", f"the attention sublayer's norm (BERT: after the attention): {_LN_IO}", MOLINA),
    Term("ln_attn_out", f"the attention sublayer's norm (BERT: after the attention): {_LN_IO}", MOLINA),
    Term("ln_mlp_in", f"the MLP sublayer's norm (BERT: after the MLP, but the last block's): {_LN_IO}", MOLINA),
    Term("ln_mlp_out", f"the MLP sublayer's norm (BERT: after the MLP, but the last block's): {_LN_IO}", MOLINA),
    Term("ln_attn_post_in", f"OLMo 2's norm of the attention output: {_LN_IO}", MOLINA),
    Term("ln_attn_post_out", f"OLMo 2's norm of the attention output: {_LN_IO}", MOLINA),
    Term("ln_mlp_post_in", f"OLMo 2's norm of the MLP output: {_LN_IO}", MOLINA),
    Term("ln_mlp_post_out", f"OLMo 2's norm of the MLP output: {_LN_IO}", MOLINA),
    Term("ln_cross_in", f"T5's decoder: the norm before cross-attention: {_LN_IO}", MOLINA),
    Term("ln_cross_out", f"T5's decoder: the norm before cross-attention: {_LN_IO}", MOLINA),
    Term(
        "encoder_final_ln_in",
        "T5: the encoder's output just before its final norm, at `layer` = number of encoder blocks",
        MACHINA,
    ),
    Term(
        "encoder_final_ln_out", "T5: the encoder's final norm's output (with its gain), the decoder reads it", MACHINA
    ),
    Term(
        "decoder_embed",
        "T5: the decoder's embedding of the text shifted right (teacher forcing), at `layer` = number of encoder"
        " blocks, the input of the first decoder block",
        GODEY,
    ),
    Term(
        "stage_embed",
        "MiT: a later stage's patch embedding (a strided convolution and its LayerNorm), where that stage's stream"
        " starts at its own width and patch grid, at `layer` = the blocks before it",
        GODEY,
    ),
    Term("stage_ln_in", f"MiT: the LayerNorm that closes a stage (not the last): {_LN_IO}", MOLINA),
    Term("stage_ln_out", f"MiT: the LayerNorm that closes a stage (not the last): {_LN_IO}", MOLINA),
    Term("ln_embed", "the parameters of BERT's embedding LayerNorm (`layer` 0)", MACHINA),
    Term("ln_attn", "the parameters of block `layer`'s attention-sublayer norm (blocks counted from 1)", MACHINA),
    Term("ln_mlp", "the parameters of block `layer`'s MLP-sublayer norm (blocks counted from 1)", MACHINA),
    Term("ln_attn_post", "the parameters of OLMo 2's attention-output norm in block `layer` (from 1)", MACHINA),
    Term("ln_mlp_post", "the parameters of OLMo 2's MLP-output norm in block `layer` (from 1)", MACHINA),
    Term("ln_cross", "the parameters of T5's decoder norm before cross-attention in block `layer` (from 1)", MACHINA),
    Term("encoder_final_ln", "the parameters of T5's encoder final norm (`layer` = number of encoder blocks)", MACHINA),
    Term("stage_ln", "the parameters of MiT's LayerNorm closing a stage (`layer` = its last block, from 1)", MACHINA),
    Term("final_ln", "the parameters of the final LayerNorm (`layer` = number of blocks)", MACHINA),
    Term(
        "qk_pre",
        "queries and keys of block `layer` (from 0) before the rotary embedding (what attention sees without one)",
        GODEY,
    ),
    Term(
        "qk_post",
        "queries and keys of block `layer` (from 0) after the rotary embedding, as attention sees them",
        GODEY,
    ),
    Term("qk_pre_norm", "OLMo 2: queries and keys of block `layer` (from 0) before their q_norm / k_norm", GODEY),
    Term("attention", "the attention probabilities and pre-softmax scores of block `layer` (from 0)", GODEY),
    Term(
        "q",
        "stream measures: the queries of block `layer` (from 0) as attention sees them (after the rotary embedding"
        " where there is one: `qk_post`, else `qk_pre`), every token, (batch, heads, tokens, d_head)",
        ANISWEEP,
    ),
    Term(
        "k",
        "stream measures: the keys of block `layer` (from 0) as attention sees them, one per query head (grouped-query"
        " attention's key heads repeated), (batch, heads, tokens, d_head)",
        ANISWEEP,
    ),
    Term(
        "attention_output",
        "stream measures: each head's attention output softmax(scaling q k^T + mask) v of block `layer` (from 0),"
        " before the output projection, (batch, heads, tokens, d_head)",
        ANISWEEP,
    ),
    Term(
        "attention_scores",
        "stream measures: the pre-softmax scores scaling q k^T of block `layer` (from 0), -inf where the key is"
        " padding or (causal) later than the query, (batch, heads, queries, keys)",
        ANISWEEP,
    ),
    Term(
        "attention_probs",
        "stream measures: the attention probabilities softmax(attention_scores) of block `layer` (from 0), 0 where"
        " the key is hidden; rows of padding queries are 0 (TransformerLens `hook_pattern`), (batch, heads, queries,"
        " keys)",
        ANISWEEP,
    ),
    Term("embed_in", "the input embedding matrix (V x d), `layer` null", MACHINA),
    Term(
        "embed_out",
        "the output embedding (unembedding) matrix, where the checkpoint has an LM head, `layer` null",
        MACHINA,
    ),
    Term(
        "weights",
        "weight measures: the checkpoint's weights alone, no activations (the built-in `circuits`: block `layer` from"
        " 0, `head`)",
        ANISWEEP,
    ),
    *(
        Term(
            f"w_{name}",
            f"the built-in weight measure `weight_matrices`: block `layer`'s (from 0) {what}",
            PICO,
        )
        for name, what in (
            ("q", "query projection W_Q, every head's rows stacked (heads d_head x d_model)"),
            ("k", "key projection W_K, each key head once (grouped-query attention's are not repeated)"),
            ("v", "value projection W_V, each value head once"),
            ("o", "output projection W_O (d_model x heads d_head)"),
        )
    ),
)


# --------------------------------------------------------------------------- metrics
def _share(name: str, what: str) -> tuple[Term, ...]:
    """A gradient share, its random controls' mean and its z."""
    where = (
        "in the rank-`rank` `subspace` (`fit`) of the site's activations, over the `stratum`'s tokens that have a"
        " gradient"
    )
    return (
        Term(name, f"{what} {where}", TANGENT, GRADIENT_SITES),
        Term(
            f"{name}_control_mean",
            f"mean of `{name}` over `gradients.n_random` seeded Gaussian random subspaces of the same rank",
            TANGENT,
            GRADIENT_SITES,
        ),
        Term(
            f"{name}_z",
            f"(`{name}` - k/d) / sd, against the exact null of a uniformly random rank-k subspace of R^d (mean k/d,"
            " sd in closed form, anisweep.tangent.shares.null_moments); the sampled controls are a check of it",
            TANGENT,
            GRADIENT_SITES,
        ),
    )


_ATTENTION = "per head, and per layer (head null) its mean over heads"
_EXACT = "over every valid token"
_SAMPLE = "over the seeded sample of tokens (hidden.parquet; non-finite rows dropped)"
_QK = "per head, from the means over every valid token"
_QK_SAMPLE = "per head, over the seeded sample of tokens (qk_sample.parquet)"
_CORR = "per checkpoint (layer null), over the `resid` layers"
_ROGUE_NAN = "NaN where avg_cos <= 0 (no anisotropy to share out)"
_NO_SPREAD = (
    f"NaN (status nan) where the sample has no spread, relative_spread < {SPREAD_TOLERANCE:g} (deviations from the"
    " mean under 1e-5 of the norm, about a hundred float32 roundings: one vector up to rounding, e.g. a corpus of one"
    " repeated word at a layer that sees no position), whose covariance is rounding"
)
_KINDS = (
    ("first", "their sequence's first valid token"),
    (
        "delimiter",
        "delimiters (a special token of the model's config or tokenizer, [SEP] and [CLS] among them, not its unknown"
        " or mask token; or a token whose text is punctuation or space)",
    ),
    ("other", "neither first nor delimiters"),
)
# measured on the default toy run (toy-bert, toy-neox at steps 0, 16, 64, 1000; 384 head/rope/q-k values): the
# 256-token sample against all 2,048 valid tokens
_QK_AVG_COS_ERROR = (
    "against all 2,048 tokens of the default toy run its absolute error is median 0.005, 95th percentile 0.03, "
    "max 0.055 (256-token sample; toy-bert and toy-neox, steps 0-1000); raise extract.qk_sample_tokens to shrink it"
)

METRICS: tuple[Term, ...] = (
    # qk.parquet, recomputed from the stored means (measures.metrics.qk_rows)
    Term(
        "qk_cos",
        f"cos(q_mean, k_mean), signed, of the head's mean query and the mean key it attends with; {_QK}",
        GODEY,
        QK_SITES,
    ),
    Term(
        "qk_mean_score",
        f"<q_mean, k_mean> / sqrt(d_head): the part of every attention logit the common drift contributes; {_QK}",
        GODEY,
        QK_SITES,
    ),
    Term("qk_mean_dot", f"<q_mean, k_mean>, unscaled; {_QK}", GODEY, QK_SITES),
    Term("q_norm_mean", "mean of ||q_i|| over every valid token; per head", GODEY, QK_SITES),
    Term(
        "k_norm_mean",
        "mean of ||k_i|| over every valid token (the key head the query head uses); per head",
        GODEY,
        QK_SITES,
    ),
    Term("qk_cos_abs_mean", "mean over a layer's heads of |qk_cos| (head null)", ANISWEEP, QK_SITES),
    Term(
        "qk_cos_concat",
        "cos of a layer's mean queries and mean keys, each concatenated over its heads (head null)",
        GODEY,
        QK_SITES,
    ),
    # qk_sample.parquet (measures.metrics.qk_sample_rows)
    Term(
        "q_avg_cos",
        f"avg_cos (exact over all pairs of the sample) of the head's sampled queries; {_QK_SAMPLE}. SAMPLED, unlike "
        f"the residual stream's avg_cos (exact over every valid token): {_QK_AVG_COS_ERROR}",
        GODEY,
        QK_SAMPLE_SITES,
    ),
    Term(
        "k_avg_cos",
        f"avg_cos (exact over all pairs of the sample) of the head's sampled keys; {_QK_SAMPLE}. SAMPLED, unlike "
        f"the residual stream's avg_cos (exact over every valid token): {_QK_AVG_COS_ERROR}",
        GODEY,
        QK_SAMPLE_SITES,
    ),
    Term(
        "q_drift_ratio",
        f"||mean q_i|| / mean ||q_i|| of the head's sampled queries; {_QK_SAMPLE}",
        GODEY,
        QK_SAMPLE_SITES,
    ),
    Term(
        "k_drift_ratio", f"||mean k_i|| / mean ||k_i|| of the head's sampled keys; {_QK_SAMPLE}", GODEY, QK_SAMPLE_SITES
    ),
    # attention.parquet (measures.metrics.attention_rows)
    Term(
        "entropy_mean",
        f"mean over valid query rows of H_i = -sum_j p_ij log p_ij (nats) over the visible keys; {_ATTENTION}",
        GODEY,
        ("attention",),
    ),
    Term(
        "entropy_norm_mean",
        f"mean of H_i / log(n_visible_i) over the query rows with more than one visible key; {_ATTENTION}",
        GODEY,
        ("attention",),
    ),
    Term("p_max_mean", f"mean over valid query rows of max_j p_ij; {_ATTENTION}", GODEY, ("attention",)),
    Term(
        "p_median_mean",
        f"mean over valid query rows of the median of p_i over the visible keys; {_ATTENTION}",
        GODEY,
        ("attention",),
    ),
    Term(
        "p_min_mean",
        f"mean over valid query rows of min_j p_ij over the visible keys; {_ATTENTION}",
        GODEY,
        ("attention",),
    ),
    Term(
        "score_mean",
        "mean of the pre-softmax scores (q.k times the attention's own scaling, 1/sqrt(d_head) unless the model"
        f" adds a factor) over every visible (query, key) pair; {_ATTENTION}",
        GODEY,
        ("attention",),
    ),
    Term(
        "score_std",
        "standard deviation (population) of the pre-softmax scores over every visible pair (streamed M2, merged"
        f" without cancellation); {_ATTENTION}; the"
        " per-layer row is the mean of the heads' stds, not the std of all the layer's scores"
        " (attention_softmax.png draws that pooled std, from the per-head rows)",
        GODEY,
        ("attention",),
    ),
    # hidden_stats.parquet, exact (measures.metrics.stats_rows)
    Term(
        "avg_cos",
        f"mean cosine over all distinct pairs, (||sum_i x_i/||x_i|| ||^2 - N) / (N (N - 1)), {_EXACT} (zero vectors "
        "left out)",
        ETHAYARAJH,
        HIDDEN_SITES,
    ),
    Term(
        "isotropic_cos_q95",
        "the 95th percentile of the cosine between two independent isotropic Gaussian vectors of the site's width d,"
        " exact ((cos + 1) / 2 ~ Beta((d - 1)/2, (d - 1)/2)): cosines above it are unlikely without anisotropy"
        " (Godey et al. 2024, Fig. 18)",
        GODEY,
        HIDDEN_SITES,
    ),
    Term(
        "avg_cos_isotropic_sf",
        "P(cos >= avg_cos) for two independent isotropic Gaussian vectors of width d: where the layer's avg_cos sits"
        " in the isotropic distribution (small: far above what isotropy gives)",
        ANISWEEP,
        HIDDEN_SITES,
    ),
    Term("drift_norm", f"||mean_i x_i||, the common drift, {_EXACT}", GODEY, HIDDEN_SITES),
    Term("drift_ratio", f"drift_norm / mean_i ||x_i||, in [0, 1], {_EXACT}", ANISWEEP, HIDDEN_SITES),
    Term("norm_mean", f"mean_i ||x_i|| {_EXACT}", MOLINA, HIDDEN_SITES),
    Term(
        "norm_std",
        f"standard deviation (population) of ||x_i|| {_EXACT} (streamed M2, merged without cancellation)",
        MOLINA,
        HIDDEN_SITES,
    ),
    Term(
        "norm_cv",
        "norm_std / norm_mean: the spread of norms (about 0 after a LayerNorm without its affine part)",
        MOLINA,
        HIDDEN_SITES,
    ),
    Term("norm_min", f"min_i ||x_i|| {_EXACT}", MOLINA, HIDDEN_SITES),
    Term("norm_max", f"max_i ||x_i|| {_EXACT}", MOLINA, HIDDEN_SITES),
    Term(
        "n_tokens",
        "number of valid tokens with finite vectors: those every statistic of the site is over",
        ANISWEEP,
        HIDDEN_SITES,
    ),
    Term(
        "n_nonfinite",
        "number of valid tokens with a NaN or inf component, left out of every statistic (> 0 flags the step)",
        ANISWEEP,
        HIDDEN_SITES,
    ),
    Term("dim", "d, the dimension of the site's vectors", ANISWEEP, HIDDEN_SITES),
    # hidden.parquet, the seeded sample (measures.metrics.sample_rows)
    Term(
        "centred_avg_cos",
        f"avg_cos of x_i - mean(x), the anisotropy left once the common drift is removed, {_SAMPLE}; {_NO_SPREAD}",
        BIS,
        SAMPLED_SITES,
    ),
    Term(
        "isoscore",
        f"IsoScore (in [0, 1], 1 = isotropic) of the covariance's eigenvalues, {_SAMPLE}; NaN with fewer tokens than"
        f" d; {_NO_SPREAD}",
        ISOSCORE,
        SAMPLED_SITES,
    ),
    Term(
        "top_eig_share",
        f"largest eigenvalue of the centred covariance over its trace, {_SAMPLE}; {_NO_SPREAD}",
        ANISWEEP,
        SAMPLED_SITES,
    ),
    Term(
        "relative_spread",
        "sum_i ||x_i - mean(x)||^2 / sum_i ||x_i||^2, the covariance's trace over the mean squared norm: the share"
        f" of the sample's second moment spread about its mean (0: every vector the same), {_SAMPLE}; below"
        f" {SPREAD_TOLERANCE:g} the sample counts as one vector (anisweep.measures.geometry.SPREAD_TOLERANCE)",
        ANISWEEP,
        SAMPLED_SITES,
    ),
    Term(
        "avg_cos_pairs",
        "mean cosine of uniformly drawn pairs of sampled tokens, as Godey et al. 2024 (Sec. 3) estimate anisotropy:"
        " the sample in a seeded order taken two by two (n_pairs disjoint, independent pairs); avg_cos is the exact"
        " value it estimates",
        GODEY,
        SAMPLED_SITES,
    ),
    Term(
        "avg_cos_pairs_se",
        "standard error of avg_cos_pairs: the sd of the pairs' cosines / sqrt(n_pairs), its sampling error",
        ANISWEEP,
        SAMPLED_SITES,
    ),
    Term("n_pairs", "number of pairs avg_cos_pairs averages: floor(n_sampled / 2)", ANISWEEP, SAMPLED_SITES),
    Term(
        "n_sampled",
        "number of sampled tokens with finite vectors (what centred_avg_cos, isoscore, top_eig_share use)",
        ANISWEEP,
        SAMPLED_SITES,
    ),
    # the spectrum's shape (measures.spectral, the built-in measure `spectral`)
    Term(
        "rankme",
        "exp(-sum p_i log p_i), p_i = s_i / sum_j s_j + 1e-7, over the singular values s of the uncentred sample (as"
        " spectra.parquet holds them: the first is mostly the drift); d for a flat spectrum, 1 for rank one,"
        f" {_SAMPLE}",
        GARRIDO,
        SAMPLED_SITES,
    ),
    Term(
        "rankme_cov",
        "RankMe of the centred covariance's eigenvalues instead of the singular values, as Li et al. 2025's code"
        f" (utils/powerlaw.py `rankme`) computes it, {_SAMPLE}",
        RANKME_COV,
        SAMPLED_SITES,
    ),
    Term(
        "alpha_req",
        "alpha of lambda_r ~ r^-alpha over the centred covariance's eigenvalues: least squares of log lambda_r on"
        " -log r weighted 1 / r over ranks 12 to 100 (Li et al.'s trange = np.arange(11, 100)); a spectrum shorter"
        " than 110 ends the fit 10 ranks before its last positive eigenvalue (alpha_req_last_rank), NaN under 3 ranks"
        f" (d < 24); larger alpha, faster decay, {_SAMPLE}",
        ALPHA_REQ,
        SAMPLED_SITES,
    ),
    Term("alpha_req_last_rank", "the last rank alpha_req fits (100 where d >= 110)", ANISWEEP, SAMPLED_SITES),
    Term(
        "prop_effective_rank",
        "proportional effective rank (per.py): exp(-sum p_i log p_i) / len(s), p_i = s_i / sum_j s_j over the singular"
        f" values of the uncentred sample, in (0, 1], {_SAMPLE}",
        PICO,
        SAMPLED_SITES,
    ),
    Term(
        "condition_number",
        "s_max / s_min of the singular values (condition_number.py; inf where s_min is 0): of the uncentred sample"
        f" {_SAMPLE} at the sampled sites (a final LayerNorm without bias has s_min near 0), of the matrix at the"
        " `weight_matrices` sites",
        PICO,
        (*SAMPLED_SITES, *WEIGHT_MATRIX_SITES),
    ),
    # correlations over layers (measures.metrics.correlation_rows)
    Term("drift_avg_cos_spearman_r", f"Spearman correlation of drift_norm and avg_cos {_CORR}", GODEY, ("resid",)),
    Term(
        "drift_avg_cos_spearman_p",
        f"two-sided permutation p-value of drift_avg_cos_spearman_r {_CORR}",
        GODEY,
        ("resid",),
    ),
    Term(
        "drift_avg_cos_spearman_p_ttest",
        "two-sided p-value of drift_avg_cos_spearman_r from Student's t with n - 2 degrees of freedom (scipy's "
        f"spearmanr; the p Godey et al. Fig. 5/16 report): for comparison with the paper only, invalid for a "
        f"handful of layers (use drift_avg_cos_spearman_p) {_CORR}",
        GODEY,
        ("resid",),
    ),
    Term("drift_avg_cos_pearson_r", f"Pearson correlation of drift_norm and avg_cos {_CORR}", GODEY, ("resid",)),
    Term(
        "drift_avg_cos_pearson_p",
        f"two-sided permutation p-value of drift_avg_cos_pearson_r {_CORR}",
        GODEY,
        ("resid",),
    ),
    Term(
        "drift_avg_cos_pearson_p_ttest",
        "two-sided p-value of drift_avg_cos_pearson_r from Student's t with n - 2 degrees of freedom (scipy's "
        f"pearsonr; the p Godey et al. Fig. 5/16 report): for comparison with the paper only, invalid for a "
        f"handful of layers (use drift_avg_cos_pearson_p) {_CORR}",
        GODEY,
        ("resid",),
    ),
    Term(
        "drift_avg_cos_p_exact",
        "1.0 when the p-values enumerate every ordering of the layers (up to 8 layers), 0.0 when seeded Monte Carlo",
        ANISWEEP,
        ("resid",),
    ),
    Term(
        "drift_avg_cos_n_permutations", "number of orderings the p-values rest on (n! when exact)", ANISWEEP, ("resid",)
    ),
    # layernorm.parquet (measures.metrics.layernorm_rows); norms without parameters have no rows
    Term("gain_mean", "mean of the norm's gain vector", MACHINA, NORM_SITES),
    Term("gain_std", "standard deviation (population) of the norm's gain vector", MACHINA, NORM_SITES),
    Term("gain_min", "smallest entry of the norm's gain vector", MACHINA, NORM_SITES),
    Term("gain_max", "largest entry of the norm's gain vector", MACHINA, NORM_SITES),
    Term("bias_norm", "||b||, the norm of the norm's bias vector; NaN without a bias (RMSNorm)", MACHINA, NORM_SITES),
    Term(
        "bias_drift_share",
        "<b, m> / ||m||^2, m = mean of final_ln_out over every valid token: the share of the drift the bias makes",
        MACHINA,
        ("final_ln",),
    ),
    # embeddings.parquet (measures.metrics.embedding_rows)
    Term(
        "partition_isotropy",
        "I(W) = min_c Z(c) / max_c Z(c), Z(c) = sum_i exp(<w_i, c>), c over the eigenvectors of W^T W and"
        " their negatives; sign-free, hence independent of the eigensolver: the primary I(W) in the figures",
        MU,
        EMBEDDING_SITES,
    ),
    Term("partition_isotropy_centred", "partition_isotropy of W minus its mean row", MU, EMBEDDING_SITES),
    Term(
        "partition_isotropy_mm",
        "I(W) over the eigenvectors with the sign eigh returns them (no negatives), as Machina & Mercer compute it;"
        " solver-dependent: the signs are the eigensolver's (their float32 code flips 1-9 of 64 eigenvectors"
        " relative to float64, moving the value by up to 3.4%), so figures draw it thin and labelled"
        " solver-dependent beside the sign-free partition_isotropy",
        MACHINA,
        EMBEDDING_SITES,
    ),
    Term("partition_isotropy_mm_centred", "partition_isotropy_mm of W minus its mean row", MACHINA, EMBEDDING_SITES),
    # rogue dimensions, from hidden_stats.parquet's unit-vector sums and the token sample (measures.rogue)
    *(
        Term(
            f"rogue_top{k}_share",
            f"share of avg_cos that the {k} dimension{'s' if k > 1 else ''} with the largest terms make: avg_cos ="
            " sum_j c_j, c_j = ((sum_i u_ij)^2 - sum_i u_ij^2) / (n (n - 1)) = mean_j^2 - M2_j / (n (n - 1)) over"
            " the unit vectors u_i of every valid token (mean_j and M2_j, the sum of squared deviations, of u_ij),"
            f" exact; {_ROGUE_NAN}",
            TIMKEY,
            SAMPLED_SITES,
        )
        for k in (1, 3, 10)
    ),
    Term(
        "rogue_dims_90",
        f"number of dimensions, largest c_j first, whose terms make 90% of avg_cos; {_ROGUE_NAN}",
        TIMKEY,
        SAMPLED_SITES,
    ),
    *(
        Term(
            f"rogue_dim_{i}",
            f"the index (from 0) of the dimension with the {nth} largest term c_j of avg_cos",
            TIMKEY,
            SAMPLED_SITES,
        )
        for i, nth in ((1, "first"), (2, "second"), (3, "third"))
    ),
    Term(
        "avg_cos_standardised",
        "avg_cos after standardising each dimension, z_ij = (x_ij - mean_j) / std_j (Timkey & van Schijndel's"
        " post-processing): mean_j and std_j (population) exact over every valid token (streamed sum and M2 of x_j,"
        f" merged without cancellation), the cosines averaged exactly over all pairs of the token sample, {_SAMPLE}:"
        " a token's norm after the shift is unknown until the one streamed pass ends",
        TIMKEY,
        SAMPLED_SITES,
    ),
    Term(
        "avg_cos_sample",
        f"avg_cos of the raw vectors, exact over all pairs of the token sample, {_SAMPLE}: avg_cos_standardised's"
        " like-for-like comparison (avg_cos is over every token)",
        TIMKEY,
        SAMPLED_SITES,
    ),
    # massive activations (measures.massive)
    Term("massive_max", f"the largest |x_ij| over every valid token and dimension, {_EXACT}", SUN, SAMPLED_SITES),
    Term(
        "massive_median",
        f"the median |x_ij| over every component of the token sample, {_SAMPLE}: a median does not stream in one pass",
        SUN,
        SAMPLED_SITES,
    ),
    Term(
        "massive_ratio",
        "massive_max / massive_median: how far the largest activation sits above the typical one (10^3-10^4 in"
        " trained LLMs, Sun et al. 2024)",
        SUN,
        SAMPLED_SITES,
    ),
    *(
        Term(
            f"massive_dim_{i}",
            f"the index (from 0) of the dimension with the {nth} largest max_i |x_ij| over every valid token",
            SUN,
            SAMPLED_SITES,
        )
        for i, nth in ((1, "first"), (2, "second"), (3, "third"))
    ),
    *(
        Term(
            f"massive_top_{kind}_share",
            f"share of the 8 tokens with the largest |component| (massive.parquet) that are {what}",
            SUN,
            SAMPLED_SITES,
        )
        for kind, what in _KINDS
    ),
    Term(
        "massive_top1_position",
        "position in its sequence of the token with the largest |component|",
        SUN,
        SAMPLED_SITES,
    ),
    Term("massive_top1_dim", "the dimension of that largest |component|", SUN, SAMPLED_SITES),
    # attention sinks, from the attention pass's column sums (measures.sinks)
    Term(
        "sink_first_mass",
        f"mean over valid query rows of the attention on their sequence's first valid key; {_ATTENTION}",
        XIAO,
        ("attention",),
    ),
    Term(
        "sink_row_max_mass",
        f"mean over valid query rows of the attention on the row's most-attended key (= p_max_mean); {_ATTENTION}",
        XIAO,
        ("attention",),
    ),
    Term(
        "sink_top_key_share",
        "of the key that receives the most attention in the batch (its column sum over its sequence's valid query"
        f" rows), that sum over the number of those rows; {_ATTENTION}",
        XIAO,
        ("attention",),
    ),
    Term("sink_top_key_position", "per head, the position of that key in its sequence", XIAO, ("attention",)),
    Term(
        "sink1_eps",
        "Sink_1^epsilon: the share of sequences whose first key's importance (the attention it receives summed over"
        " the sequence's valid query rows over their number; `compute_attention_sink`'s importance_scores[..., 0])"
        " exceeds epsilon (config `sinks.epsilon`, 0.3): per head; per layer its mean over heads; per model (layer"
        " null) the share over every layer, head and sequence, Gu et al.'s number over 100",
        GU,
        ("attention",),
    ),
    Term("sink1_epsilon", "the epsilon sink1_eps used (config `sinks.epsilon`), layer null", GU, ("attention",)),
    *(
        Term(
            f"sink_top_{kind}_share",
            f"share of the 8 keys that receive the most attention (sink_keys.parquet) that are {what}"
            + ("; per head, and per layer its mean over heads" if kind == "first" else "; per head"),
            XIAO,
            ("attention",),
        )
        for kind, what in _KINDS
    ),
    # LayerNorm outlier dimensions (measures.ln_outliers)
    Term(
        "ln_gain_outliers",
        "number of the norm's gain entries more than 3 standard deviations (population) from the gain's mean",
        KOVALEVA,
        NORM_SITES,
    ),
    Term(
        "ln_bias_outliers",
        "number of the norm's bias entries more than 3 standard deviations from the bias's mean; no row for a norm"
        " without a bias (RMSNorm)",
        KOVALEVA,
        ("ln_embed", "ln_attn", "ln_mlp", "stage_ln", "final_ln"),
    ),
    Term(
        "ln_gain_outlier_dim_1",
        "the gain outlier furthest from the mean (its dimension, from 0); no row for a norm without one",
        KOVALEVA,
        NORM_SITES,
    ),
    Term(
        "ln_outliers_in_rogue",
        "how many gain or bias outlier dimensions are among the 10 dimensions with the largest terms of avg_cos"
        " (rogue_dim_*) of the residual stream at the norm's layer (`resid`; the final norm: `final_ln_out`)",
        TIMKEY,
        NORM_SITES,
    ),
    Term(
        "ln_rogue_1_is_outlier",
        "1 where the dimension with the largest term of avg_cos of the residual stream at the norm's layer (the final"
        " norm: its output) is a gain or bias outlier, else 0",
        TIMKEY,
        NORM_SITES,
    ),
    # gradients.parquet (measures.gradient_metrics)
    *_share(
        "grad_energy_share",
        "sum_t ||P g_t||^2 / sum_t ||g_t||^2 of the LM loss's gradients g_t at the site, P the projector on the"
        " subspace",
    ),
    *_share(
        "grad_anisotropy_share",
        "sum_i lambda_i ||P v_i||^2 / sum_i lambda_i over the top-`rank` eigenpairs of the gradients' centred"
        " covariance, P the projector on the subspace",
    ),
)


ELHAGE = "Elhage et al. 2021 (A Mathematical Framework for Transformer Circuits)"
LOGIT_LENS = "nostalgebraist 2020 (logit lens); Molina 2023 (Traveling Words)"
_TIES = (
    "ties broken at random, in expectation: a token whose own key ties with t others takes the mid-rank (the keys"
    " above it plus t / 2), so that a fully tied row (a zero normalised embedding, [PAD] at initialisation) is chance"
)
_PROBE = (
    "the probe tokens' embeddings normalised by the norm before block `layer`'s attention (anisweep.measures.circuits)"
)
_LENS = (
    "each layer's residual state read through the model's own head (final norm and unembedding; an encoder's MLM"
    " head): a decoder's over extract's sampled tokens, the target the next token; an encoder's over the masked"
    " tokens of its masked pass (15% of the first mini-batch's text tokens masked), the target the token masked"
)
#: The built-in weight measure `circuits` (site `weights`) and the logit lens (site `resid`).
WEIGHT_METRICS: tuple[Term, ...] = (
    Term(
        "gini",
        "Gini coefficient of the matrix's |entries| sorted ascending (gini.py): sum_i (2i - n - 1) x_(i) / (n sum x),"
        " 0 all equal, (n - 1) / n one non-zero",
        PICO,
        WEIGHT_MATRIX_SITES,
    ),
    Term(
        "hoyer",
        "Hoyer sparsity of the matrix's entries (hoyer.py): (sqrt(n) - ||x||_1 / ||x||_2) / (sqrt(n) - 1), 0 all equal,"
        " 1 one non-zero",
        PICO,
        WEIGHT_MATRIX_SITES,
    ),
    Term(
        "weight_matrices",
        "the one row of a checkpoint whose weights the built-in `weight_matrices` cannot read, value NaN (status"
        " `nan`) and `reason` why (an architecture no weight layout names)",
        ANISWEEP,
        ("weights",),
    ),
    Term(
        "tied_embeddings",
        "1 where the unembedding is the token embedding (tied or not saved), else 0",
        ANISWEEP,
        ("weights",),
    ),
    Term(
        "head_saved",
        "1 where the checkpoint holds its output head, 0 where it was saved without it (a BertModel, without"
        " cls.predictions.*: a sentence-embedding BERT): W_OV is then read through the word embeddings, which BERT's"
        " MLM decoder is tied to, without the head's transform LayerNorm gain, and the logit lens has no head to read"
        " (its row `logit_lens` says so)",
        ANISWEEP,
        ("weights",),
    ),
    Term(
        "probe_tokens",
        "how many tokens probe W_QK and W_OV: the vocabulary, or a seeded sample of `weights.probe_tokens`",
        ANISWEEP,
        ("weights",),
    ),
    Term(
        "circuits",
        "the one row of a checkpoint whose circuits cannot be read, value NaN (status `nan`) and `reason` why: an"
        " architecture no weight layout names (an image or audio model, an encoder-decoder); its other tables stand",
        ANISWEEP,
        ("weights",),
    ),
    Term(
        "qk_self_rank",
        f"per head, the mean rank (0 first) of a probe token's own key among all probe keys under x_i^T W_QK x_j,"
        f" over (n - 1): 0 always attends most to itself, 0.5 chance; {_TIES}; {_PROBE}",
        MOLINA,
        ("weights",),
    ),
    Term(
        "qk_self_top",
        "per head, the share of probe tokens whose highest-scoring key under W_QK = W_Q^T W_K is themselves"
        f" (a token tied at the top with t others counts 1 / (t + 1)); {_TIES}; {_PROBE}",
        MOLINA,
        ("weights",),
    ),
    Term(
        "qk_symmetric_share",
        "per head, ||(W_QK + W_QK^T)/2||_F^2 / ||W_QK||_F^2: 1 symmetric (tokens attend to their like), 0.5 none,"
        " 0 antisymmetric",
        MOLINA,
        ("weights",),
    ),
    Term(
        "qk_singular_value",
        "per head, the `rank`-th singular value of W_QK = W_Q^T W_K (rank 1 to d_head), unscaled: Molina 2023's code"
        " (santiag0m/traveling-words, svd_analysis.py) takes the singular values of W_QK / sqrt(d_head), the scores'"
        " scaling, so the paper's are these divided by sqrt(d_head) (qk_top_sv_share is the same either way)",
        MOLINA,
        ("weights",),
    ),
    Term("qk_top_sv_share", "per head, sigma_1^2 / sum sigma_i^2 of W_QK", MOLINA, ("weights",)),
    Term(
        "ov_copying",
        f"per head, the share of probe tokens whose largest logit of U W_O W_V x over the whole vocabulary is"
        f" themselves, U the unembedding times the final norm's gain (an encoder's MLM decoder times its transform"
        f" LayerNorm's gain; a BERT saved without its head: the word embeddings, see `head_saved`); {_PROBE}",
        MOLINA,
        ("weights",),
    ),
    Term(
        "ov_positive_eigen",
        "per head, sum(Re lambda) / sum(|lambda|) over the eigenvalues of the full OV circuit U W_O W_V X^T on the"
        " probe: near 1 a copying head, near -1 an anti-copying one",
        ELHAGE,
        ("weights",),
    ),
    Term(
        "ov_singular_value",
        "per head, the `rank`-th singular value of W_OV = W_O W_V (rank 1 to d_head)",
        MOLINA,
        ("weights",),
    ),
    Term("ov_top_sv_share", "per head, sigma_1^2 / sum sigma_i^2 of W_OV", MOLINA, ("weights",)),
    Term("lens_rank", f"mean rank (0: the top logit) of the target, {_LENS}", LOGIT_LENS, ("resid",)),
    Term("lens_log_rank", f"mean log(1 + rank) of the target, {_LENS}", LOGIT_LENS, ("resid",)),
    Term("lens_top1", f"share of tokens whose target is the top logit, {_LENS}", LOGIT_LENS, ("resid",)),
    Term("lens_prob", f"mean probability of the target, {_LENS}", LOGIT_LENS, ("resid",)),
    Term(
        "lens_kl",
        f"mean KL(p_last || p_layer) in nats from the last layer's distribution to the layer's, {_LENS}",
        LOGIT_LENS,
        ("resid",),
    ),
    Term(
        "lens_angle",
        "mean angle (radians) between a lens token's centred residual states at layer - 1 and layer: its step"
        " on LayerNorm's hypersphere into the layer",
        MOLINA,
        ("resid",),
    ),
    Term("lens_tokens", "how many tokens the lens read that have a target (layer null)", LOGIT_LENS, ("resid",)),
    Term(
        "logit_lens",
        "the one row of a checkpoint the logit lens cannot read, value NaN (status `nan`) and `reason` why: a model"
        " saved without its head (a BertModel), an encoder whose tokenizer has no mask token (extract's masked pass"
        " keeps no states), an architecture no weight layout names, an evaluation batch that is no longer the one"
        " extract ran on; its other tables stand",
        ANISWEEP,
        ("resid",),
    ),
)
METRICS = (*METRICS, *WEIGHT_METRICS)


# --------------------------------------------------------------------------- columns
COLUMNS: tuple[Term, ...] = (
    Term("family", "checkpoint family (e.g. `pythia`, `multiberts`, `toy`)", ANISWEEP),
    Term("model", "model name within the family", ANISWEEP),
    Term("seed", "the model's training seed (null where the family has none)", ANISWEEP),
    Term("step", "optimizer step of the checkpoint", ANISWEEP),
    Term(
        "tokens_seen",
        "tokens seen in training: step x tokens per step (null where unknown: a local run without tokens_per_step)",
        ANISWEEP,
    ),
    Term(
        "layer",
        "where in depth: for `qk_*` and `attention` the block index from 0; for the hidden-state and norm sites the"
        " residual layer (0 = the embedding output, l = block l's output) or the block (from 1) a norm belongs to;"
        " null for whole-model values",
        ANISWEEP,
    ),
    Term("head", "attention head; null for per-layer values", ANISWEEP),
    Term("site", "where the metric was measured (the sites above)", ANISWEEP),
    Term("metric", "the metric's name (the metrics above)", ANISWEEP),
    Term(
        "subspace",
        "gradient metrics: the subspace the share is in, `seminmf` (the tangent proxy, fitted to the raw activations),"
        " `pca` (the centred activations' top axes) or `pca_uncentred` (the raw activations': the reference semi-NMF"
        " must beat to add anything to low-rank geometry); null for other metrics",
        TANGENT,
    ),
    Term(
        "fit",
        "gradient metrics: `checkpoint` (subspace fitted on this checkpoint's activations) or `fixed` (fitted once on"
        " an early window of steps); null for other metrics",
        TANGENT,
    ),
    Term("rank", "gradient metrics: the subspace's rank k; null for other metrics", TANGENT),
    Term(
        "stratum",
        "gradient metrics: the tokens the share is over, `all`, or by their id's count (in the training corpus"
        " where known: a toy's, or a run folder's token_counts.parquet; else in the evaluation batch) `frequent`,"
        " `middle`, `rare` (terciles of the tokens' counts), or `special` (the tokenizer's special tokens); null"
        " for other metrics",
        TANGENT,
    ),
    Term("value", "the metric's value (float64; NaN or null where undefined)", ANISWEEP),
    Term(
        "measure",
        "the registered measure that wrote the row: a built-in's name (see Measures), `gradients`, or a user's measure",
        ANISWEEP,
    ),
    Term(
        "reason",
        "why the row's value is NaN, where the measure knows: the one row (metric = the measure's name) of a measure"
        " that cannot run on the checkpoint, e.g. the logit lens of a model saved without its head; null elsewhere",
        ANISWEEP,
    ),
    Term(
        "status",
        "sweep.parquet only: `ok`, `duplicate`, `nonfinite`, `nan` or `unfinished`; a step the audit left out has its"
        " audit status, `duplicate`, `missing`, `no_weights` or `incomplete` (see Statuses)",
        ANISWEEP,
    ),
    Term("duplicate_of_step", "sweep.parquet only: the step whose weights a `duplicate` step repeats", ANISWEEP),
    Term(
        "weights_sha256", "sweep.parquet only: the hash of the checkpoint's weight files (from extract.json)", ANISWEEP
    ),
    Term(
        "audit",
        "sweep.parquet of a Hub model only: the audit's status of the step's branch (grid.parquet's `status`: `ok`,"
        " `duplicate`, `partial`, `missing`, `no_weights`, `incomplete`, `unchecked`; see Statuses)",
        ANISWEEP,
    ),
    Term(
        "repeats",
        "sweep.parquet of a Hub model only: the branch whose weights a `duplicate` step's are, or the branches that"
        " serve a `partial` step's shared shards",
        ANISWEEP,
    ),
)


# --------------------------------------------------------------------------- phases.parquet (measures.phases)
LI = "Li et al. 2025 (Tracing the Representation Geometry of Language Models, arXiv 2509.23024)"
_PHASE_RULE = (
    "Per curve (a metric, `rankme`, `rankme_cov` or `alpha_req`, at one layer and site over the analysed steps):"
    " a running median over 2 x `phases.smooth` + 1 neighbouring checkpoints (default 3; the ends kept as measured),"
    " then a zigzag on it with delta = `phases.tolerance` (default 0.05) x the median of its absolute values: the"
    " first leg starts at the first step and takes the direction in which the smoothed curve first moves delta away"
    " from its first value (a smaller wiggle before that is no turn); a leg ends at a turn, its farthest point, once"
    " the curve has moved back from it by at least delta, and every leg but the last, which runs to the last step,"
    " moves by at least delta. A turn's step is the measured extreme within the median's window, after the bound"
    " before it and before the next turn: every phase spans at least one step. A phase is named by the direction its"
    " measured values move from its first step to its last (RankMe falling, alpha-ReQ rising: the spectrum"
    " concentrates); neighbouring legs the measured values move across the same way are one phase, and a leg they do"
    " not move across joins the phase before it (the first, the one after): no phase's start and end values move"
    " against its name. A curve with fewer than `phases.min_steps` (default 5) analysed steps, or that never moves"
    " delta away from its first value, has one row without a phase and its `reason`. The phases are descriptive: the"
    " rule tests no turn against the checkpoints' noise, and a curve of pure noise gets phases too. Li et al. mark"
    " the phases by eye; the rule is anisweep's (anisweep.measures.phases)."
)
#: The phases phases.parquet names (column `phase`).
PHASES: tuple[Term, ...] = (
    Term(
        "warmup",
        "the warm-up collapse: the first phase, where the spectrum concentrates from the first step (RankMe falls,"
        " alpha-ReQ rises) to the first turn; a curve that spreads from its first step has none on its grid",
        LI,
    ),
    Term(
        "entropy_seeking",
        "a phase where the spectrum spreads (RankMe rises, alpha-ReQ falls): the representation expands in every"
        " direction",
        LI,
    ),
    Term(
        "compression_seeking",
        "a phase after the first where the spectrum concentrates (RankMe falls, alpha-ReQ rises): anisotropic"
        " consolidation along the dominant directions",
        LI,
    ),
)
#: The columns of results/{family}/{model}/phases.parquet: one row per phase of each curve.
PHASE_COLUMNS: tuple[Term, ...] = (
    Term("family, model, seed", "the model, as in sweep.parquet", ANISWEEP),
    Term(
        "scope",
        "`layer`: the curve of one layer and site; `model`: the model's summary curve, its last hidden state as Li et"
        " al. take it (site `final_ln_out` at its layer, or where a model has none its last layer's `resid`), whose"
        " rows repeat that layer's",
        LI,
    ),
    Term(
        "layer, site, metric", "the curve: as in sweep.parquet (metric `rankme`, `rankme_cov` or `alpha_req`)", ANISWEEP
    ),
    Term("phase_index", "the phase's place in the curve's sequence, from 0; null in a row without a phase", ANISWEEP),
    Term("phase", "`warmup`, `entropy_seeking` or `compression_seeking` (above); null where `reason` says why", LI),
    Term(
        "start_step, end_step", "the steps the phase runs between: the first step, a turn, or the last step", ANISWEEP
    ),
    Term("start_tokens_seen, end_tokens_seen", "tokens seen at those steps (null where unknown)", ANISWEEP),
    Term("start_value, end_value", "the metric's measured value at those steps", ANISWEEP),
    Term("ends_at_turn", "whether the phase ends at a turn (false: it runs to the last analysed step)", ANISWEEP),
    Term("n_steps", "the curve's analysed steps (status ok, finite value)", ANISWEEP),
    Term(
        "delta",
        "the rule's threshold for this curve: tolerance x the median of the smoothed curve's absolute values",
        ANISWEEP,
    ),
    Term("smooth, tolerance, min_steps", "the rule's settings (config `phases`)", ANISWEEP),
    Term(
        "reason",
        "why the curve has no phase: too few steps, or it never moves delta away from its first value; null elsewhere",
        ANISWEEP,
    ),
)


# --------------------------------------------------------------------------- comparisons
KORNBLITH = "Kornblith et al. 2019 (CKA); Song et al. 2012 (unbiased HSIC)"
RAGHU = "Raghu et al. 2017 (SVCCA); google/svcca@1f3fbf1, cca_core.py"
MORCOS = "Morcos et al. 2018 (PWCCA); google/svcca@1f3fbf1, pwcca.py"
_PAIR = "of a (layer, site) of two checkpoints, on the sampled tokens both hold (hidden.parquet)"
#: The metrics of compare.parquet (anisweep.measures.compare): one row per pair, layer, site and metric.
COMPARE_METRICS: tuple[Term, ...] = (
    Term(
        "cka",
        f"linear CKA {_PAIR}: ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) of the centred samples, from d x d products"
        " (never an n x n Gram matrix); 1 for the same representation up to rotation, scale and shift. In the"
        " `layers` role, of two layers of one checkpoint",
        KORNBLITH,
        ("resid", "final_ln_in", "final_ln_out"),
    ),
    Term(
        "cka_debiased",
        f"linear CKA {_PAIR} with the unbiased HSIC estimator (config compare.cka_debiased): near 0 for unrelated"
        " representations, where the biased estimate grows with d / n",
        KORNBLITH,
        ("resid", "final_ln_in", "final_ln_out"),
    ),
    Term(
        "svcca",
        f"SVCCA {_PAIR}: each side reduced to its top principal directions explaining compare.svcca_variance (0.99)"
        " of its variance, then the mean canonical correlation of the two; a side of less than full rank on its"
        " principal directions above the rounding of its values (docs/measures.md); NaN (with the reason) where"
        " the sample has no more tokens than dimensions, holds non-finite values, or its CCA is ill-conditioned; no"
        " row at a layer wider than compare.cca_max_width (1,024 by default: CKA alone there)",
        RAGHU,
        ("resid", "final_ln_in", "final_ln_out"),
    ),
    Term(
        "pwcca",
        f"projection-weighted CCA {_PAIR}: the canonical correlations weighted by the summed |projection| of the"
        " checkpoint's neurons on the canonical variates, as the reference computes it (epsilon 0); a side of less"
        " than full rank enters as its centred principal coordinates above the rounding of its values"
        " (docs/measures.md); NaN (with the reason) where the sample has no more tokens than dimensions, holds"
        " non-finite values, or its CCA is ill-conditioned; no row at a layer wider than compare.cca_max_width"
        " (1,024 by default: CKA alone there)",
        MORCOS,
        ("resid", "final_ln_in", "final_ln_out"),
    ),
)
#: The columns of the pair tables and compare.parquet beyond the checkpoint's identity (family ... tokens_seen),
#: layer, site, measure, metric, value and reason, which mean what they mean in metrics.parquet.
COMPARE_COLUMNS: tuple[Term, ...] = (
    Term("ref_model", "the reference checkpoint's model (another seed's in the `seed` role)", ANISWEEP),
    Term("ref_seed", "the reference checkpoint's seed", ANISWEEP),
    Term("ref_step", "the reference checkpoint's step", ANISWEEP),
    Term("ref_tokens_seen", "the reference checkpoint's tokens seen", ANISWEEP),
    Term("ref_layer", "the reference's layer: the row's own but in the `layers` role (layer against layer)", ANISWEEP),
    Term("n_tokens", "the sampled tokens the two representations are compared on", ANISWEEP),
    Term(
        "role",
        "compare.parquet only: why the pair is compared, `final` (against the model's last step), `previous` (the"
        " step before), `step` (a named step, config compare.against), `seed` (another model of the family at the"
        " same step, compare.seeds) or `layers` (the checkpoint's layers against each other, compare.layer_steps)",
        ANISWEEP,
    ),
)


@dataclass(frozen=True)
class Status:
    """One status word: `where` it is written, and what it means (one meaning wherever it is written)."""

    name: str
    where: str
    meaning: str


_SWEEP = "sweep.parquet `status`"
_GRID = "grid.parquet `status`, sweep.parquet `audit`"
#: Every status a table writes (sweep.parquet's `status` and `audit`, grid.parquet's `status`; a step the audit
#: left out of a sweep has its audit status as its sweep `status`, with the same meaning).
STATUSES: tuple[Status, ...] = (
    Status(
        "ok",
        f"{_SWEEP}; {_GRID}",
        "nothing found wrong: in a sweep, a row analysed and drawn; in the audit, a branch with weights of its own",
    ),
    Status(
        "duplicate",
        f"{_SWEEP}; {_GRID}",
        "the checkpoint's weight files are byte for byte another step's or branch's (`duplicate_of_step`, `repeats`):"
        " not the training step its name says; left out of the figures, and under `audit.flagged: skip` not"
        " downloaded",
    ),
    Status(
        "partial",
        _GRID,
        "some of the branch's shards are another branch's (`repeats`; grid.parquet's `shared_files`, `shared_with`):"
        " analysed, and flagged",
    ),
    Status(
        "missing",
        f"{_GRID}; {_SWEEP} of a step the audit left out",
        "no branch of that name (or no such repository) on the Hub: nothing to download",
    ),
    Status(
        "no_weights",
        f"{_GRID}; {_SWEEP} of a step the audit left out",
        "a branch on the Hub without weight files",
    ),
    Status(
        "incomplete",
        f"{_GRID}; {_SWEEP} of a step the audit left out",
        "a branch whose shard index names weight files the branch does not hold (grid.parquet's `absent_files`): it"
        " cannot be loaded; not downloaded",
    ),
    Status(
        "unchecked",
        _GRID,
        "the audit knows nothing of the branch (offline, and the Hugging Face cache does not hold it)",
    ),
    Status(
        "nonfinite",
        _SWEEP,
        "the checkpoint's activations went NaN or inf (`n_nonfinite` > 0, or NaN attention, query/key or embedding"
        " statistics): every row of the step, left out of the figures",
    ),
    Status(
        "nan",
        _SWEEP,
        "the row's own value is NaN or inf (an undefined metric; `reason` says why where the measure knows, as in the"
        " one row of a measure that cannot run on the checkpoint); the rest of the step is analysed",
    ),
    Status(
        "unfinished",
        _SWEEP,
        "a step of the config without metrics: its jobs failed, or the run was stopped before them; only in the"
        " partial sweep a failed run leaves (docs/reruns.md), which the next run makes again, retrying the step,"
        " and from which no figure is drawn",
    ),
)


def metric_names() -> set[str]:
    return {term.name for term in METRICS}


def site_names() -> set[str]:
    return {term.name for term in SITES}


def column_names() -> set[str]:
    return {term.name for term in COLUMNS}


def status_names() -> set[str]:
    return {status.name for status in STATUSES}


#: How the metrics table names a site list that is a whole group.
_SITE_GROUPS = {
    HIDDEN_SITES: "every hidden-state site: `resid`, `final_ln_in`, `final_ln_out`, each norm's `ln_*_in`, `ln_*_out`",
    QK_SITES: "`qk_pre`, `qk_post`, `qk_pre_norm`",
    NORM_SITES: "each norm with a gain: `ln_*`, `final_ln`",
}


def _sites(sites: tuple[str, ...]) -> str:
    return _SITE_GROUPS.get(sites) or ", ".join(f"`{site}`" for site in sites)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_escape(cell) for cell in row) + " |" for row in rows]
    return lines


def _measure_rows(measures) -> list[tuple[str, ...]]:
    rows = []
    for m in measures:
        reads = ", ".join(
            f"`{r}`" for r in {"table": m.tables, "weight": m.tensors, "comparative": ("hidden",)}.get(m.kind, m.sites)
        )
        figures = ", ".join(f"`{f}`" for f in m.figures) or "-"
        rows.append((f"`{m.name}`", m.kind, reads, figures, m.definition, "anisweep" if m.builtin else f"`{m.entry}`"))
    return rows


def builtin_weight_measures() -> list:
    """The built-in weight measures as the registry sees them."""
    from anisweep.measures.circuits import circuits
    from anisweep.measures.matrices import weight_matrices
    from anisweep.measures.registry import measure_of

    return [
        measure_of(circuits, "anisweep.measures.circuits:circuits", builtin=True),
        measure_of(weight_matrices, "anisweep.measures.matrices:weight_matrices", builtin=True),
    ]


LOGIT_LENS_ROW = (
    "`logit_lens`",
    "lens",
    "`hidden` (`resid`), the head's weights",
    "`logit_lens.png`",
    "Each layer's sampled residual states read through the checkpoint's own head (final norm and unembedding; an"
    " encoder's MLM head) against the next token (an encoder's own token): rank, probability, KL to the last layer,"
    " the angle between consecutive layers (anisweep.measures.logit_lens).",
    "anisweep",
)


#: How "exact over every valid token" is kept for the streamed variances (docs/metrics.md's introduction).
_STREAMED = (
    "Exact over every valid token means streamed through the one forward pass, summed in float64 across",
    "mini-batches. Every streamed variance (`norm_std`, `score_std`, each dimension's mean and std behind",
    "`avg_cos_standardised`, the rogue terms c_j, the gradients' covariance) comes from each mini-batch's own mean",
    "and M2 (the sum of squared deviations from that mean), merged in float64 by Chan et al.'s update",
    "(`anisweep.moments`), never from sum x^2 / n - mean^2, which loses as many digits as mean^2 / variance has:",
    "against two-pass float64 on the same values it is within 1e-7 relative where a dimension is 1000 + 0.1 N(0, 1)",
    "or a rogue one of mean 31.5 and variance 9.5e-3 (tests/extract/test_streamed_variances.py). The per-dimension",
    "sums are in float64 within a mini-batch too; a score row's own M2 comes from its scores shifted by the row's",
    "max, in float32; norms are float64 at the sampled sites and float32 at the others (`ln_*`), where norm_std",
    "holds each norm's float32 rounding (6e-8 of it).",
)


#: What the Multi-Bootstrap's tables say of these metrics (docs/metrics.md; docs/measures.md has the whole of it).
_UNCERTAINTY = (
    "Every value is one checkpoint's on one evaluation sample. With `bootstrap` enabled, `bootstrap.parquet` (a",
    "model) and `results/bootstrap/{group}.parquet` (a group of seeds) give the metrics that `bootstrap.measures`",
    "names an interval: the Multi-Bootstrap (Sellam et al. 2022) redraws the evaluation sequences (and, for a group,",
    "the seeds) with replacement B times; `estimate` is this table's value (a group: its mean over seeds), `low` and",
    "`high` the percentiles of the redrawn values at the `level` (95%: the spread another sample of sequences, or",
    "another seed, would give), `bias` their mean minus the estimate. A measure of the sampled vectors (IsoScore,",
    "RankMe) is recomputed on the drawn units' sampled tokens; one built of sums (avg_cos, drift, norms, the rogue",
    "dimensions' shares, attention's row means, the sinks, q/k alignment) from the drawn resampling units' sums",
    "(`units.parquet`), exactly. The",
    "step tests (`against` `previous` or `final`) give the difference to another step, its interval and a two-sided",
    "p-value, on the same draws (paired); the comparisons of two steps (`cka`, `svcca`, `pwcca`: `against` and",
    "`ref_step`, no p-value) the interval of each step's similarity to the previous and the final step, both steps'",
    "tokens of the drawn units; a comparison of two groups names its design (`paired`: seed i with seed",
    "i; `unpaired`: independent seeds, the same sequences). An interval that leaves out 0 is a change larger than",
    "another sample would give (`anisweep.results.changes`); docs/measures.md, Uncertainty over seeds and sequences.",
)


def _trainer_loggers() -> list[str]:
    """The names under which anisweep.live.AnisweepCallback sends each step's summaries to the Trainer's loggers."""
    definitions = {term.name: term.definition for term in METRICS}
    measures = ", ".join(f"`{m}`" for m in LOGGED_MEASURES)
    scheme = scalar_name("<metric>", "<site>", "<n>")
    return [
        "## Trainer loggers",
        "",
        "`anisweep.live.AnisweepCallback` sends these per-layer values of each step it analyses through the Trainer's",
        "own logging, as the Trainer sends the loss, so every `report_to` integration (TensorBoard, Weights & Biases,",
        f"MLflow, ...) records them at the step's `global_step`. Each is named `{scheme}`",
        "(`<n>` numbered as metrics.parquet's `layer`) and is the value of metrics.parquet's per-layer row (head",
        "null) of that metric, site and layer, computed from the tables the step wrote, by the measures",
        f"{measures} (no second forward pass). TensorBoard and Weights & Biases show",
        "them under `train/`, as the loss (`train/geometry/...`); a NaN value is a gap in the curve. They go out in",
        "a log of their own beside the Trainer's: its loss, grad_norm and learning_rate are logged at the same steps,",
        "with the same values, as without the callback (the loss at a step is still the mean over the steps since its",
        "last log), and a `TrainerControl` a callback returns from `on_log` for them is the one the training goes on",
        "with.",
        "",
        *_table(
            ("name", "sites", "definition"),
            [
                (f"`{scalar_name(metric, '<site>', '<n>')}`", _sites(sites), definitions[metric])
                for metric, sites in LOGGED
            ],
        ),
        "",
    ]


def glossary_markdown(measures=()) -> str:
    """docs/metrics.md: the measures, and the metrics, sites and columns of metrics.parquet as markdown tables;
    `measures`, a user's (anisweep.measures.registry.user_measures), are listed after the built-in ones with
    their docstrings as definitions."""
    from anisweep.measures.metrics import builtin_measures

    lines = [
        "# metrics.parquet: metrics, sites and columns",
        "",
        "Generated from `src/anisweep/measures/glossary.py` (`python -m anisweep.measures.glossary`); edit the",
        "glossary, not this file. Natural log everywhere; padding is masked out of every statistic. One row of",
        "metrics.parquet is one (layer, head, site, metric, subspace, fit, rank, stratum) of a checkpoint.",
        "",
        *_STREAMED,
        "",
        *_UNCERTAINTY,
        "",
        "## Measures",
        "",
        "What computes the rows (column `measure`; `gradients`: the gradient analysis), and the figures of each model",
        "(`results/{family}/{model}/figures/`) that draw them. A table measure reads the checkpoint's extract tables;",
        "a stream measure listens at sites of the forward pass; a weight measure reads the checkpoint's weights alone",
        "(docs/measures.md). The logit lens reads extract's sampled residual states (an encoder's at masked tokens)",
        "through the checkpoint's own head. A measure that cannot run on a checkpoint (the logit lens of a model saved",
        "without its head) writes one row whose metric is its own name, with value NaN and the `reason`; the",
        "checkpoint's other rows stand.",
        "",
        *_table(
            ("measure", "kind", "reads", "figures", "definition", "from"),
            [*_measure_rows([*builtin_measures(), *builtin_weight_measures()]), LOGIT_LENS_ROW]
            + _measure_rows(measures),
        ),
        "",
        "## Metrics",
        "",
        *_table(
            ("metric", "sites", "definition", "source"),
            [(f"`{t.name}`", _sites(t.sites), t.definition, t.source) for t in METRICS],
        ),
        "",
        "## Sites",
        "",
        *_table(("site", "definition", "source"), [(f"`{t.name}`", t.definition, t.source) for t in SITES]),
        "",
        "## Columns",
        "",
        *_table(("column", "definition", "source"), [(f"`{t.name}`", t.definition, t.source) for t in COLUMNS]),
        "",
        "## Phases (phases.parquet)",
        "",
        "`results/{family}/{model}/phases.parquet` names the phases that RankMe and alpha-ReQ trace over a model's",
        "steps (Li et al. 2025: a warm-up collapse, an entropy-seeking expansion, a compression-seeking",
        "consolidation), from its sweep. The rule:",
        "",
        *textwrap.wrap(_PHASE_RULE, width=115),
        "",
        *_table(("phase", "definition", "source"), [(f"`{t.name}`", t.definition, t.source) for t in PHASES]),
        "",
        *_table(
            ("column", "definition", "source"),
            [(", ".join(f"`{n}`" for n in t.name.split(", ")), t.definition, t.source) for t in PHASE_COLUMNS],
        ),
        "",
        *_comparisons(),
        *_trainer_loggers(),
        "## Statuses",
        "",
        "Every status word the tables write, each with one meaning wherever it stands. A step the audit left out of",
        "a sweep has its audit status as its sweep `status`.",
        "",
        *_table(("status", "where", "meaning"), [(f"`{t.name}`", t.where, t.meaning) for t in STATUSES]),
        "",
    ]
    return "\n".join(lines)


def _comparisons() -> list[str]:
    return [
        "## Comparisons",
        "",
        "The comparative measures (anisweep.measures.compare; docs/measures.md, Comparative measures) compare two",
        "checkpoints, per layer and site, on the sampled tokens both hold. Each pair's rows are",
        "`results/{family}/{model}/step{N}/compare/{ref_model}.step{M}.parquet` (a checkpoint's layers against each",
        "other: `compare/layers.parquet`), gathered per model in `results/{family}/{model}/compare.parquet` with",
        "their `role`. A user's comparative measure (`@comparative_measure`) adds rows whose `measure` is its name.",
        "",
        *_table(
            ("metric", "sites", "definition", "source"),
            [(f"`{t.name}`", _sites(t.sites), t.definition, t.source) for t in COMPARE_METRICS],
        ),
        "",
        *_table(("column", "definition", "source"), [(f"`{t.name}`", t.definition, t.source) for t in COMPARE_COLUMNS]),
        "",
    ]


def write_docs(path: str | Path = "docs/metrics.md") -> Path:
    path = Path(path)
    path.write_text(glossary_markdown(), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_docs(*sys.argv[1:2]))
