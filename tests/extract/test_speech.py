"""Speech transformers (wav2vec 2.0, HuBERT; Whisper in test_whisper.py) against Hugging Face's eager forward on the
same waveforms: q and k as each layer's own projections give them, the attention probabilities eager attention returns
(over the valid frames of a padded batch of clips of unequal length), the residual stream entering the first block
and after each block, and the final LayerNorm."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
import soundfile
import torch
import transformers
from test_extract import check_all

from anisweep.adapters import adapter_for
from anisweep.adapters.base import TRANSFORMERLENS_HOOKS
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import extract_checkpoint, run
from anisweep.media import MediaCorpus, make_media_batch

from conftest import run_extract, saved

RATE = 16_000
LENGTHS = (450, 320, 605, 200, 500)  # samples: clips of unequal length, padded to the longest

W2V = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    conv_dim=(16, 16),
    conv_kernel=(10, 4),
    conv_stride=(5, 4),
    num_conv_pos_embeddings=8,
    num_conv_pos_embedding_groups=4,
    vocab_size=12,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    feat_proj_dropout=0.0,
    layerdrop=0.0,
    mask_time_prob=0.0,
)


def wav2vec2_config(**extra):
    return transformers.Wav2Vec2Config(**(W2V | extra))


def hubert_config(**extra):
    return transformers.HubertConfig(**(W2V | extra))


def whisper_config(**extra):
    tiny = dict(
        vocab_size=64,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_layers=1,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_source_positions=25,  # 50 mel frames: 1 s at a 20 ms hop (`whisper_extractor`)
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    return transformers.WhisperConfig(**(tiny | extra))


SLOW = pytest.mark.slow
SPEECH = {  # name: (model class, config); the bare models (`*_base`) and HuBERT's pre-LN variant run in the slow set
    "wav2vec2": (transformers.Wav2Vec2ForCTC, lambda: wav2vec2_config()),  # post-LN, group-norm conv stack
    "wav2vec2_stable": (
        transformers.Wav2Vec2ForPreTraining,
        lambda: wav2vec2_config(do_stable_layer_norm=True, feat_extract_norm="layer", codevector_dim=16),
    ),
    "wav2vec2_base": (transformers.Wav2Vec2Model, lambda: wav2vec2_config(do_stable_layer_norm=True)),
    "hubert": (transformers.HubertForCTC, lambda: hubert_config()),
    "hubert_stable": (
        transformers.HubertModel,
        lambda: hubert_config(do_stable_layer_norm=True, feat_extract_norm="layer", feat_proj_layer_norm=False),
    ),
    "whisper": (transformers.WhisperForConditionalGeneration, lambda: whisper_config()),
    "whisper_base": (transformers.WhisperModel, lambda: whisper_config()),
}
#: Whisper, an encoder-decoder, is compared with eager in test_whisper.py
KINDS = [
    pytest.param(k, marks=SLOW) if k in ("wav2vec2_base", "hubert_stable") else k
    for k in SPEECH
    if not k.startswith("whisper")
]


def waveforms(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in lengths]


def wav2vec2_extractor():
    return transformers.Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=RATE, padding_value=0.0, do_normalize=True, return_attention_mask=True
    )


def whisper_extractor():
    return transformers.WhisperFeatureExtractor(feature_size=8, sampling_rate=RATE, hop_length=320, chunk_length=1)


def audio_corpus(clips) -> MediaCorpus:
    """The clips as the WAV files of an audio corpus."""
    data = []
    for clip in clips:
        buffer = io.BytesIO()
        soundfile.write(buffer, clip, RATE, format="WAV", subtype="FLOAT")
        data.append(buffer.getvalue())
    return MediaCorpus("audio", tuple(f"clip{i}.wav" for i in range(len(clips))), tuple(data))


def audio_batch(kind, clips):
    """The batch extract runs on: the clips through anisweep.media.make_media_batch and the model's feature
    extractor."""
    extractor = whisper_extractor() if kind.startswith("whisper") else wav2vec2_extractor()
    return make_media_batch(extractor, audio_corpus(clips), len(clips))


def saved_model(tmp_path, kind):
    cls, config = SPEECH[kind]
    return saved(tmp_path, cls, config(), kind)


@torch.no_grad()
def speech_reference(path, batch, mask=True):
    """Eager attention, q/k from the projections, the stream from hooks. `mask` False: the waveforms without their
    attention mask (padding frames attended to)."""
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    whisper = model.config.model_type == "whisper"
    encoder = model.encoder
    layers = encoder.layers
    n_heads = model.config.encoder_attention_heads if whisper else model.config.num_attention_heads
    grabbed, handles = {}, []

    def keep(name, split=False):
        def hook(module, args, output):
            if split:
                grabbed[name] = output.view(*output.shape[:2], n_heads, -1).transpose(1, 2)
            else:
                grabbed[name], grabbed[f"{name}_in"] = output, args[0]

        return hook

    handles.append(layers[0].register_forward_pre_hook(lambda module, args: grabbed.update(resid0=args[0])))
    for i, block in enumerate(layers):
        attention = block.self_attn if whisper else block.attention
        handles.append(block.register_forward_hook(keep(f"resid{i + 1}")))
        handles.append(attention.q_proj.register_forward_hook(keep(("q", i), split=True)))
        handles.append(attention.k_proj.register_forward_hook(keep(("k", i), split=True)))
    stable = whisper or model.config.do_stable_layer_norm
    final = encoder.layer_norm if stable else layers[-1].final_layer_norm
    handles.append(final.register_forward_hook(keep("final")))
    if whisper:
        out = encoder(input_features=batch["input_features"], output_attentions=True)
    else:
        given = batch["attention_mask"] if mask else None
        out = model(input_values=batch["input_values"], attention_mask=given, output_attentions=True)
    for handle in handles:
        handle.remove()
    d = model.config.d_model // n_heads if whisper else model.config.hidden_size // n_heads
    return dict(
        attentions=list(out.attentions),
        q={(i, "pre"): grabbed[("q", i)] for i in range(len(layers))},
        k={(i, "pre"): grabbed[("k", i)] for i in range(len(layers))},
        resid=[grabbed["resid0"]] + [grabbed[f"resid{i + 1}"] for i in range(len(layers))],
        ln_in=grabbed["final_in"],
        ln_out=grabbed["final"],
        d=d,
        scaling=[d**-0.5] * len(layers),
    )


def frames_valid(path, batch):
    """Transformers' own frame mask of the padded waveforms."""
    model = transformers.AutoModel.from_pretrained(path)
    t = int(model._get_feat_extract_output_lengths(torch.tensor(batch["input_values"].shape[1])))
    return model._get_feature_vector_attention_mask(t, batch["attention_mask"])


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", KINDS)
def test_speech_transformers_match_eager_reference(tmp_path, kind):
    path = saved_model(tmp_path, kind)
    batch = audio_batch(kind, waveforms())
    tables, loaded = run_extract(path, batch, batch_size=2)
    ref = speech_reference(path, batch)
    t = ref["resid"][0].shape[1]
    if kind.startswith("whisper"):  # every one of the encoder's frames, the padding of the 1 s window included
        assert t == 25
        valid = torch.ones(len(LENGTHS), t, dtype=torch.bool)
    else:
        valid = frames_valid(path, batch)
        assert valid.shape[1] == t
        lengths = valid.sum(1).tolist()
        assert lengths == [int(loaded.base._get_feat_extract_output_lengths(torch.tensor(n))) for n in LENGTHS]
        assert len(set(lengths)) == len(LENGTHS)  # padding in every row but the longest
    check_all(tables, ref, {"attention_mask": valid}, causal=False)
    assert set(tables["hidden"]["token_id"].unique()) == {-1}
    assert tables["qk"]["layer"].max() == len(ref["resid"]) - 2
    if not kind.startswith("whisper"):
        assert tables["embeddings"].is_empty()


def test_the_padding_mask_matters(tmp_path):
    """The same model without its attention mask attends to the padding frames: on the valid frames its attention
    (and everything after the first layer) differs from what extract records, so the comparison above can fail."""
    path = saved_model(tmp_path, "wav2vec2")
    batch = audio_batch("wav2vec2", waveforms())
    tables, _ = run_extract(path, batch, batch_size=5)
    valid = {"attention_mask": frames_valid(path, batch)}
    check_all(tables, speech_reference(path, batch), valid, causal=False)
    with pytest.raises(AssertionError):
        check_all(tables, speech_reference(path, batch, mask=False), valid, causal=False)


@SLOW
def test_whisper_queries_are_the_projection_not_the_prescaled_query(tmp_path):
    """Whisper scales q inside q_proj's caller: the recorded q mean is q_proj's, d_head^0.5 times the query
    transformers hands the attention function."""
    path = saved_model(tmp_path, "whisper")
    batch = audio_batch("whisper", waveforms())
    tables, _ = run_extract(path, batch, batch_size=5)
    ref = speech_reference(path, batch)
    row = tables["qk"].filter((tables["qk"]["layer"] == 0) & (tables["qk"]["head"] == 0)).row(0, named=True)
    q = ref["q"][(0, "pre")][:, 0].reshape(-1, ref["d"]).double()
    np.testing.assert_allclose(row["q_mean"], q.mean(0).numpy(), atol=1e-5)
    assert not np.allclose(row["q_mean"], (q.mean(0) * ref["d"] ** -0.5).numpy(), atol=1e-3)


@pytest.mark.parametrize("kind", sorted(SPEECH))
def test_every_norm_site_has_a_hook_name_and_the_layers_are_the_encoders(kind):
    cls, config = SPEECH[kind]
    model = cls(config())
    adapter = adapter_for(model.config)
    assert adapter.modality == "audio" and cls.__name__ in adapter.architectures
    base = adapter.base_model(model)
    named = " / ".join(site for _, site in TRANSFORMERLENS_HOOKS)
    sites = adapter.layernorm_sites(base)
    for site in sites:
        assert f"{site.site}_in" in named and f"{site.site}_out" in named
    g = adapter.geometry(model.config)
    if kind.startswith("whisper"):  # 2 encoder blocks, then 1 decoder block with its cross-attention
        assert len(adapter.attention_sites(base)) == 4 and g.n_layers == 3 and g.d_head == 8
        assert [(s.layer, s.site) for s in adapter.resid_sites(base)] == [
            (0, "resid"),
            (1, "resid"),
            (2, "resid"),
            (2, "decoder_embed"),
            (3, "resid"),
        ]
        assert [s.layer for s in sites if s.site in ("encoder_final_ln", "final_ln")] == [2, 3]
        return
    assert len(adapter.attention_sites(base)) == g.n_layers == 2 and g.d_head == 8
    assert [s.layer for s in adapter.resid_sites(base)] == [0, 1, 2]
    assert [s.layer for s in sites if s.site == "final_ln"] == [2]


@SLOW
@pytest.mark.parametrize("kind", ["wav2vec2", "whisper"])
def test_a_half_precision_model_takes_the_extractors_float32(tmp_path, kind):
    """The feature extractor gives float32; a model loaded in bfloat16 gets its input in its own dtype."""
    path = saved_model(tmp_path, kind)
    loaded = load_model(path, "bfloat16", "cpu")
    settings = ExtractSettings(batch_size=5, sample_tokens=100, device="cpu", dtype="bfloat16")
    recorder = run(loaded, audio_batch(kind, waveforms()), settings, progress=False)
    assert sum(stats.n_nonfinite for stats in recorder.vectors.values()) == 0
    assert recorder.n_positions > 0


@pytest.mark.parametrize("kind", [pytest.param("wav2vec2", marks=SLOW), pytest.param("whisper", marks=SLOW)])
def test_extract_checkpoint_reads_an_audio_corpus_through_the_checkpoints_own_extractor(tmp_path, kind):
    """The whole extract step on a checkpoint folder holding its preprocessor_config.json: preflight takes the
    audio corpus for an audio model, the feature extractor makes the batch (Whisper's pads every clip to its
    window), the tables and extract.json are written."""
    path = saved_model(tmp_path, kind)
    (whisper_extractor() if kind == "whisper" else wav2vec2_extractor()).save_pretrained(path)
    corpus = audio_corpus(waveforms())
    ident = {"family": "local", "model": kind, "step": 1, "seed": None, "tokens_seen": None}
    settings = ExtractSettings(n_sequences=4, seq_len=16, batch_size=3, sample_tokens=32, device="cpu")
    info = extract_checkpoint({**ident, "path": str(path)}, corpus, settings, tmp_path / "out", progress=False)
    batch = audio_batch(kind, waveforms()[:4])
    expected = 4 * 25 if kind == "whisper" else int(frames_valid(path, batch).sum())
    assert info["n_valid_tokens"] == expected
    qk = pl.read_parquet(tmp_path / "out" / "qk.parquet").filter(pl.col("layer") < 2)  # the encoder's
    assert qk.height == 2 * 4 and set(qk["n_tokens"]) == {expected}
