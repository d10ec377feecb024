"""The names of the sites where hidden states and attention are read, as the tables and the glossary name them
(anisweep.measures.glossary defines each)."""

#: The input and output of each norm: statistics streamed over every valid token (hidden_stats.parquet), no sample.
NORM_INPUT_OUTPUT_SITES = (
    "ln_embed_in",
    "ln_embed_out",
    "ln_attn_in",
    "ln_attn_out",
    "ln_mlp_in",
    "ln_mlp_out",
    "ln_attn_post_in",
    "ln_attn_post_out",
    "ln_mlp_post_in",
    "ln_mlp_post_out",
    "ln_cross_in",
    "ln_cross_out",
    "encoder_final_ln_in",
    "encoder_final_ln_out",
    "stage_ln_in",
    "stage_ln_out",
)
#: Sites whose seeded token sample extract keeps whole (hidden.parquet: extract.recorder.SAMPLED_SITES).
SAMPLED_SITES = ("resid", "final_ln_in", "final_ln_out")
#: Every site of hidden_stats.parquet: the streamed statistics (avg_cos, drift, norms, counts).
HIDDEN_SITES = (*SAMPLED_SITES, *NORM_INPUT_OUTPUT_SITES, "decoder_embed", "stage_embed")
#: What a stream measure sees at each layer's attention, per head (docs/measures.md, Sites).
ATTENTION_STREAM_SITES = ("q", "k", "attention_output", "attention_scores", "attention_probs")
#: Every site a stream measure can listen at (anisweep.measures.registry.Site).
STREAM_SITES = (*HIDDEN_SITES, *ATTENTION_STREAM_SITES)
