"""A fake Hugging Face Hub cache for offline tests, laid out exactly as huggingface_hub writes it.

::

    {hf_home}/hub/models--{org}--{name}/
        refs/{revision}              # the 40-hex commit hash, no newline
        snapshots/{commit}/{file}    # relative symlinks into ../../blobs/
        blobs/{etag}                 # sha256 for LFS files (weights), git blob sha1 for the others
        trees/{commit}.json          # the tree listing huggingface_hub >= 1.x caches per commit

With ``HF_HUB_OFFLINE=1`` (see :func:`offline_hub`), ``snapshot_download(repo_id, revision=...)`` and
``from_pretrained(repo_id, revision=...)`` resolve through ``refs/`` without any network, so tests lay tiny
random models out under the real repo ids and revisions and exercise the real download code.

Reuse from other tests::

    from hubcache import build_hub_cache, offline_hub, save_tiny_bert, save_tiny_pythia

    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    save_tiny_pythia(tmp_path / "m")
    build_hub_cache(hf_home, "EleutherAI/pythia-70m", {"step1000": tmp_path / "m"})
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "build_hub_cache",
    "offline_hub",
    "repo_cache_dir",
    "save_tiny_bert",
    "save_tiny_decoder",
    "save_tiny_pythia",
    "tiny_bert_tokenizer",
    "tiny_neox_tokenizer",
]

# Extensions the Hub stores through LFS (their blob name in the cache is the sha256 of the content).
LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".pt", ".ckpt", ".model")

FileSource = Path | Mapping[str, bytes]


def repo_cache_dir(hf_home: Path, repo_id: str) -> Path:
    return Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _read_files(source: FileSource) -> dict[str, bytes]:
    if isinstance(source, Mapping):
        return {str(k): bytes(v) for k, v in source.items()}
    root = Path(source)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _entry(name: str, data: bytes) -> tuple[str, dict]:
    """(blob file name, tree-listing entry) as the Hub reports them."""
    git_oid = _git_blob_sha1(data)
    if name.endswith(LFS_SUFFIXES):
        sha = hashlib.sha256(data).hexdigest()
        return sha, {"size": len(data), "blob_id": git_oid, "lfs_sha256": sha, "lfs_size": len(data)}
    return git_oid, {"size": len(data), "blob_id": git_oid}


def build_hub_cache(
    hf_home: Path,
    repo_id: str,
    revisions: Mapping[str, FileSource],
    *,
    extra_files: Mapping[str, bytes] | None = None,
    remote_only: Mapping[str, bytes] | None = None,
    commits: Mapping[str, str] | None = None,
    write_tree: bool = True,
) -> dict[str, str]:
    """Lay out ``repo_id`` in ``hf_home/hub`` with one snapshot per revision; return {revision: commit}.

    ``revisions`` maps a revision name (``"step1000"``, ``"main"``) to a folder saved with ``save_pretrained``
    (all its files are taken) or to a ``{filename: bytes}`` mapping. ``extra_files`` are added to every
    snapshot (e.g. a dummy ``tf_model.h5``). ``remote_only`` files are listed in the cached tree listing but
    not downloaded: a snapshot_download that asks for them offline fails (IncompleteSnapshotError), so a
    test proves the real allow_patterns skip them. The same bytes under two revisions share one blob.
    ``commits`` pins commit hashes; by default they are derived from repo, revision and content.
    Call again to add revisions to the same repo.
    """
    repo_dir = repo_cache_dir(hf_home, repo_id)
    out: dict[str, str] = {}
    for revision, source in revisions.items():
        files = _read_files(source)
        files.update(extra_files or {})
        entries = {name: _entry(name, data) for name, data in files.items()}
        commit = (commits or {}).get(revision) or hashlib.sha1(
            json.dumps([repo_id, revision, sorted((n, e[0]) for n, e in entries.items())]).encode()
        ).hexdigest()
        assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), commit

        snapshot = repo_dir / "snapshots" / commit
        for name, data in files.items():
            blob_name, _ = entries[name]
            blob = repo_dir / "blobs" / blob_name
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                blob.write_bytes(data)
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.relpath(blob, link.parent))

        refs = repo_dir / "refs" / revision
        refs.parent.mkdir(parents=True, exist_ok=True)
        refs.write_text(commit)  # huggingface_hub writes the bare hash, no newline

        if write_tree:
            listing = {name: e[1] for name, e in entries.items()}
            listing.update({name: _entry(name, data)[1] for name, data in (remote_only or {}).items()})
            tree = repo_dir / "trees" / f"{commit}.json"
            tree.parent.mkdir(parents=True, exist_ok=True)
            tree.write_text(json.dumps({"format_version": 1, "files": dict(sorted(listing.items()))}, indent=1))
        out[revision] = commit
    return out


def offline_env(hf_home: Path) -> dict[str, str]:
    """This process's environment for a subprocess (a Snakemake run) that reads the Hugging Face cache at
    ``hf_home`` offline: every other HF_ and TRANSFORMERS_ setting left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return env


def offline_hub(monkeypatch, hf_home: Path) -> Path:
    """Point huggingface_hub (and transformers) at ``hf_home`` and switch them offline, for this test only.

    huggingface_hub reads HF_HOME / HF_HUB_OFFLINE into ``huggingface_hub.constants`` at import, so the
    environment alone is not enough once it is imported: patch the constants too (offline mode is read
    at call time through ``constants.is_offline_mode()``, which transformers also uses).
    """
    from huggingface_hub import constants

    hf_home = Path(hf_home)
    (hf_home / "hub").mkdir(parents=True, exist_ok=True)
    for var, value in {
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hf_home


# ---------------------------------------------------------------------------------------------- tiny models

_WORDS = "the a of to and in is was for on that with as by it at from his her an be this are".split()
_CORPUS = [
    "the cat sat on the mat and the dog sat on the log",
    "a model of the world is a map of the territory",
    "attention is all you need said the paper in 2017",
    "isotropy anisotropy drift query key value head layer norm",
]


def write_eval_corpus(path: Path) -> Path:
    """An evaluation text of the sentences the tiny tokenizers were built from (real tokens, no unknown one): 200
    paragraphs of three of them each, drawn with a fixed seed."""
    rng = random.Random(0)
    path.write_text("\n\n".join(" ".join(rng.choices(_CORPUS, k=3)) for _ in range(200)) + "\n")
    return path


def tiny_neox_tokenizer():
    """A byte-level BPE like Pythia's, trained on a few sentences, as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|padding|>",
    )


def tiny_bert_tokenizer(folder: Path):
    """An uncased WordPiece vocab written as ``vocab.txt`` (as MultiBERTs ships it); returns the tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set("".join(_CORPUS).replace(" ", "")))
    vocab_list = specials + _WORDS + chars + ["##" + c for c in chars]
    vocab_list = list(dict.fromkeys(vocab_list))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab_list) + "\n")
    vocab = {w: i for i, w in enumerate(vocab_list)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def save_tiny_pythia(
    folder: Path,
    seed: int = 0,
    *,
    safetensors: bool = True,
    pytorch_bin: bool = False,
    max_shard_size: str | None = None,
) -> Path:
    """A random 2-layer GPTNeoXForCausalLM (hidden 32, 4 heads, partial rotary 0.25) + BPE tokenizer.
    ``max_shard_size="60KB"`` saves sharded safetensors (3 shards + index), as the large Pythia models are."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    folder = Path(folder)
    tok = tiny_neox_tokenizer()
    cfg = GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        partial_rotary_factor=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(cfg).eval()
    if safetensors:
        model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        cfg.architectures = ["GPTNeoXForCausalLM"]
        cfg.save_pretrained(folder)
    if pytorch_bin:
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    tok.save_pretrained(folder)
    return folder


def save_tiny_bert(folder: Path, seed: int = 0, *, safetensors: bool = False) -> Path:
    """A random 2-layer BertForPreTraining (hidden 32, 4 heads) laid out like a MultiBERTs repo:
    config.json, pytorch_model.bin (no safetensors unless asked), vocab.txt, tokenizer_config.json."""
    import torch
    from transformers import BertConfig, BertForPreTraining

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tiny_bert_tokenizer(folder)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        architectures=["BertForPreTraining"],
    )
    torch.manual_seed(seed)
    model = BertForPreTraining(cfg).eval()
    if safetensors:
        model.save_pretrained(folder)
    else:
        cfg.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 64}))
    return folder


#: Tiny configs of the other Hub suites' architectures, as their real checkpoints are laid out: OLMo 1 ties its
#: embeddings and has clip_qkv on some checkpoints; TinyLlama has grouped-query attention; the Mistral GPT-2 runs
#: scale attention by 1/(layer + 1).
TINY_DECODERS = {
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(tie_word_embeddings=True, clip_qkv=8.0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True)),
}


def save_tiny_decoder(folder: Path, kind: str, seed: int = 0) -> Path:
    """A random 2-layer decoder of `kind` (a key of TINY_DECODERS: hidden 32, 4 heads) + the byte-level BPE
    tokenizer, saved as safetensors."""
    import torch
    import transformers

    config_name, model_name, extra = TINY_DECODERS[kind]
    folder = Path(folder)
    tok = tiny_neox_tokenizer()
    if kind == "gpt2":
        sizes = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)
    else:
        sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        sizes.update(max_position_embeddings=64)
    cfg = getattr(transformers, config_name)(
        vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, **sizes, **extra
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
