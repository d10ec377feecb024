"""Checkpoint catalogues: which checkpoints exist, under which names, and how many tokens each has seen.

One small catalogue class per family (the shape of the PyPI ``lm-checkpoints`` package):

* :class:`Pythia` -- ``EleutherAI/pythia-{size}[-deduped|-seed{n}]``, revision ``step{N}``.
* :class:`MultiBERTs` -- ``google/multiberts-seed_{s}-step_{k}k`` (seeds 0-4) and ``google/multiberts-seed_{s}``.
* :class:`OLMo` -- ``allenai/OLMo-1B-hf``, branch ``step{N}-tokens{T}B`` (looked up by N at fetch).
* :class:`OLMo2` -- ``allenai/OLMo-2-0425-1B``, branch ``stage1-step{N}-tokens{T}B`` (looked up by N at fetch).
* :class:`MistralGPT2` -- ``stanford-crfm/{run}-gpt2-{small,medium}-x{seed}``, branch ``checkpoint-{N}``.
* :class:`TinyLlama` -- seven ``TinyLlama-1.1B-intermediate-step-*`` repositories, revision ``main``.
* :class:`LocalRun` -- a user's own training run: ``step{N}/`` or Trainer-style ``checkpoint-{N}/`` subfolders.
* :class:`Toy` -- the toy models the pipeline trains itself, under ``toy_root/{name}/step{N}/``.

A model entry of the config (``{family, name, steps, ...}``) becomes a list of :class:`Checkpoint` through
:func:`resolve`; :func:`resolve_all` does a whole ``models`` list. Every mistake (unknown family, size,
seed, step, key) fails here, before any download, with a :class:`ConfigError` that names the offending
value and the nearest valid ones.

Decisions (also in the class docstrings):

* ``step`` is always the integer optimizer step. MultiBERTs ``step_20k`` is step 20000.
* MultiBERTs step 2,000,000 of seeds 0-4 is the ``-step_2000k`` repo, so that a sweep (``all``, a list or a
  range) stays inside one release (the intermediate checkpoints). ``steps: final`` selects the separately
  published final model ``google/multiberts-seed_{s}`` (also step 2,000,000); seeds 5-24 only have that one.
* Pythia seed variants are the PolyPythias runs ``pythia-{14m,31m,70m,160m,410m}-seed{1..9}``. Their ``seed``
  is n; the original Pythia models (and ``-deduped``) record ``seed=1234``, the seed the PolyPythias model
  cards give for them.
* A local run without ``tokens_per_step`` in its entry gets ``tokens_seen`` from the checkpoint's
  ``trainer_state.json`` (``num_input_tokens_seen``, when the Trainer counted it), else ``None`` (a null in
  the Parquet tables): unknown, never a made-up number.
* Step selection: ``all`` (the whole published grid), ``final`` (its last step), one int, a list of ints
  (each must exist), or a range ``{start, stop, every}`` (stop inclusive) that selects the grid steps s with
  ``start <= s <= stop`` and ``(s - start) % every == 0`` (``every`` defaults to 1: every grid step in the
  range). A range that selects nothing is an error.
"""

from __future__ import annotations

import bisect
import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import grids

__all__ = [
    "ConfigError",
    "Checkpoint",
    "Pythia",
    "MultiBERTs",
    "OLMo",
    "OLMo2",
    "MistralGPT2",
    "TinyLlama",
    "LocalRun",
    "Toy",
    "FAMILIES",
    "PYTHIA_STEPS",
    "MULTIBERTS_STEPS",
    "PYTHIA_TOKENS_PER_STEP",
    "MULTIBERTS_TOKENS_PER_STEP",
    "tokens_per_step",
    "family_of",
    "final_step",
    "params_millions",
    "resolve",
    "resolve_all",
    "select_steps",
]


class ConfigError(ValueError):
    """A model entry names something that does not exist; the message names the nearest valid ones."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint: the unit of work of the pipeline (``{family}/{model}/step{step}``)."""

    family: str  # a key of FAMILIES: "pythia", "multiberts", "olmo", "olmo2", "gpt2", "tinyllama", "local", "toy"
    model: str  # "pythia-70m", "pythia-160m-seed3", "pythia-70m-deduped", "seed_0", "my-run", "toy-bert"
    step: int  # integer optimizer step
    tokens_seen: int | None  # step * tokens per step; None when unknown (local run without tokens_per_step)
    seed: int | None
    repo_id: str | None = None  # Hub families
    revision: str | None = None  # Hub families
    path: str | None = None  # local/toy: the checkpoint folder
    tokenizer: str | None = None  # local: a tokenizer folder or Hub id the config names (else the run's own)

    @property
    def key(self) -> str:
        """``{family}/{model}/step{step}``: the Snakemake wildcards and the results sub-folder."""
        return f"{self.family}/{self.model}/step{self.step}"

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Checkpoint:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


# ---------------------------------------------------------------------------------------------- helpers


def _nearest_names(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    choices = list(choices)
    near = difflib.get_close_matches(str(value), choices, n=n, cutoff=0.0)
    return near or choices[:n]


def _nearest_steps(step: int, grid: Sequence[int]) -> list[int]:
    """The grid steps just below and just above ``step`` (one of them when it lies outside the grid)."""
    i = bisect.bisect_left(grid, step)
    return [grid[j] for j in (i - 1, i) if 0 <= j < len(grid)]


def _fmt(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
            return int(value)
        raise ConfigError(f"{what} must be an integer step, got {value!r}")
    return value


_RANGE_KEYS = ("start", "stop", "every")


def select_steps(spec: Any, grid: Sequence[int], where: str) -> list[int]:
    """Pick steps out of a sorted ``grid`` according to a config ``steps`` value.

    ``where`` names the grid in error messages (e.g. "the pythia grid", "the steps of toy-bert").
    """
    grid = sorted(set(grid))
    if not grid:
        raise ConfigError(f"{where} is empty")
    if spec is None:
        raise ConfigError(
            f"missing 'steps' for {where}: use 'all', 'final', a list of steps, or {{start, stop, every}}"
        )
    if isinstance(spec, str) and not re.fullmatch(r"\d+", spec.strip()):
        word = spec.strip().lower()
        if word == "all":
            return list(grid)
        if word in ("final", "last"):
            return [grid[-1]]
        raise ConfigError(
            f"steps: {spec!r} is not a step selection; nearest: {_fmt(_nearest_names(word, ['all', 'final']))}"
            " (or a list of steps, or {start, stop, every})"
        )
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in _RANGE_KEYS]
        if unknown:
            k = unknown[0]
            raise ConfigError(
                f"steps range has unknown key {k!r}; valid keys: {_fmt(_RANGE_KEYS)}"
                f" (nearest: {_fmt(_nearest_names(str(k), _RANGE_KEYS, 1))})"
            )
        start = _as_int(spec.get("start", grid[0]), "steps.start")
        stop = _as_int(spec.get("stop", grid[-1]), "steps.stop")
        every = _as_int(spec.get("every", 1), "steps.every")
        if every <= 0:
            raise ConfigError(f"steps.every must be positive, got {every}")
        if stop < start:
            raise ConfigError(f"steps range stop={stop} is below start={start}")
        chosen = [s for s in grid if start <= s <= stop and (s - start) % every == 0]
        if not chosen:
            raise ConfigError(
                f"steps range {{start: {start}, stop: {stop}, every: {every}}} selects no step of {where};"
                f" nearest: {_fmt(_nearest_steps(start, grid))}"
            )
        return chosen
    if isinstance(spec, (int, str)) and not isinstance(spec, bool):
        spec = [spec]
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        if not spec:
            raise ConfigError(f"steps: empty list for {where}")
        out = []
        for raw in spec:
            step = _as_int(raw, "each listed step")
            if step not in grid:
                raise ConfigError(f"step {step} is not in {where}; nearest: {_fmt(_nearest_steps(step, grid))}")
            out.append(step)
        return sorted(set(out))
    raise ConfigError(f"steps: {spec!r} is not 'all', 'final', a list of steps, or {{start, stop, every}}")


# ---------------------------------------------------------------------------------------------- Pythia

PYTHIA_STEPS: tuple[int, ...] = (0,) + tuple(2**i for i in range(10)) + tuple(range(1000, 143001, 1000))
PYTHIA_TOKENS_PER_STEP = 1024 * 2048  # 2,097,152
MULTIBERTS_STEPS: tuple[int, ...] = tuple(k * 1000 for k in (*range(0, 201, 20), *range(300, 2001, 100)))
MULTIBERTS_TOKENS_PER_STEP = 256 * 512  # 131,072

assert len(PYTHIA_STEPS) == 154 and len(MULTIBERTS_STEPS) == 29


class Pythia:
    """EleutherAI Pythia and PolyPythias: ``EleutherAI/{name}`` at revision ``step{N}``.

    Names: ``pythia-{size}`` for every size, ``pythia-{size}-deduped`` (not 14m/31m) and the PolyPythias
    seed runs ``pythia-{size}-seed{n}``, n in 1..9, for 14m-410m. All share the 154-step grid
    (0, 1, 2, 4, ..., 512, then 1000..143000 every 1000; ``step143000`` is ``main``).
    ``seed`` is n for the seed runs and 1234 (the original Pythia seed) otherwise.
    """

    family = "pythia"
    org = "EleutherAI"
    sizes = ("14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")
    deduped_sizes = tuple(s for s in sizes if s not in ("14m", "31m"))
    seed_sizes = ("14m", "31m", "70m", "160m", "410m")
    seeds = tuple(range(1, 10))
    original_seed = 1234
    steps = PYTHIA_STEPS
    tokens_per_step = PYTHIA_TOKENS_PER_STEP
    entry_keys = ("family", "name", "steps")
    checks_before_fetch = True  # config.json and the tokenizer against the extract settings (preflight)
    _NAME = re.compile(r"pythia-(?P<size>[0-9.]+[mb])(?:-(?P<deduped>deduped)|-seed(?P<seed>\d+))?")

    @classmethod
    def names(cls) -> list[str]:
        out = [f"pythia-{s}" for s in cls.sizes]
        out += [f"pythia-{s}-deduped" for s in cls.deduped_sizes]
        out += [f"pythia-{s}-seed{n}" for s in cls.seed_sizes for n in cls.seeds]
        return out

    @classmethod
    def parse(cls, name: str) -> int:
        """Validate ``name``; return its seed."""
        m = cls._NAME.fullmatch(str(name))
        if m is None or m["size"] not in cls.sizes:
            raise ConfigError(
                f"{name} is not a Pythia model; nearest: {_fmt(_nearest_names(name, cls.names()))}"
                f" (sizes: {_fmt(cls.sizes)}; variants: -deduped, -seed1..-seed9)"
            )
        size = m["size"]
        if m["deduped"] and size not in cls.deduped_sizes:
            deduped = [f"pythia-{s}-deduped" for s in cls.deduped_sizes]
            raise ConfigError(
                f"{name} does not exist: pythia-{size} has no -deduped variant;"
                f" nearest: pythia-{size}, {_fmt(_nearest_names(name, deduped, 2))}"
            )
        if m["seed"] is not None:
            seed = int(m["seed"])
            near = [f"pythia-{size}"]
            if size not in cls.seed_sizes:
                if seed in cls.seeds:
                    near.append(f"pythia-410m-seed{seed}")
                raise ConfigError(
                    f"{name} does not exist: seed variants (PolyPythias, seeds 1-9) exist only for"
                    f" {_fmt(cls.seed_sizes)}; nearest: {_fmt(near)}"
                )
            if seed not in cls.seeds:
                near.insert(0, f"pythia-{size}-seed{min(cls.seeds, key=lambda s: abs(s - seed))}")
                raise ConfigError(f"{name} does not exist: PolyPythias seeds are 1-9; nearest: {_fmt(near)}")
            return seed
        return cls.original_seed

    @classmethod
    def checkpoint(cls, name: str, step: int) -> Checkpoint:
        seed = cls.parse(name)
        if step not in cls.steps:
            near = _fmt(_nearest_steps(step, cls.steps))
            raise ConfigError(f"step {step} is not in the pythia grid; nearest: {near}")
        return Checkpoint(
            family=cls.family,
            model=name,
            step=step,
            tokens_seen=step * cls.tokens_per_step,
            seed=seed,
            repo_id=f"{cls.org}/{name}",
            revision=f"step{step}",
        )

    @classmethod
    def resolve(cls, name: str, steps: Any) -> list[Checkpoint]:
        cls.parse(name)
        return [cls.checkpoint(name, s) for s in select_steps(steps, cls.steps, "the pythia grid")]

    @classmethod
    def resolve_entry(cls, entry: Mapping[str, Any], **_: Any) -> list[Checkpoint]:
        return cls.resolve(entry["name"], entry.get("steps"))

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return cls.steps[-1]  # the defective branches serve the final model under early step names

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        size = cls._NAME.fullmatch(ckpt.model)["size"]  # "1.4b" -> 1400
        return float(size[:-1]) * (1000 if size.endswith("b") else 1)


# ---------------------------------------------------------------------------------------------- MultiBERTs


class MultiBERTs:
    """Google MultiBERTs: model names ``seed_{s}``, s in 0..24, revision ``main``.

    Seeds 0-4 have 29 intermediate checkpoints ``google/multiberts-seed_{s}-step_{k}k`` (k = 0, 20, ..., 200,
    300, ..., 2000); step = k * 1000. Seeds 5-24 have only the final model ``google/multiberts-seed_{s}``
    (step 2,000,000). For seeds 0-4, step 2,000,000 inside a sweep is the ``-step_2000k`` repo (one release
    for the whole series); ``steps: final`` asks for the final-model repo ``google/multiberts-seed_{s}``.
    """

    family = "multiberts"
    org = "google"
    seeds = tuple(range(25))
    intermediate_seeds = tuple(range(5))
    steps = MULTIBERTS_STEPS
    final_step = 2_000_000
    tokens_per_step = MULTIBERTS_TOKENS_PER_STEP
    entry_keys = ("family", "name", "steps")
    checks_before_fetch = True
    _NAME = re.compile(r"seed_(\d+)")

    @classmethod
    def names(cls) -> list[str]:
        return [f"seed_{s}" for s in cls.seeds]

    @classmethod
    def parse(cls, name: str) -> int:
        m = cls._NAME.fullmatch(str(name))
        if m is None or int(m[1]) not in cls.seeds:
            near = (
                [f"seed_{min(cls.seeds, key=lambda s: abs(s - int(m[1])))}"]
                if m is not None
                else _nearest_names(name, cls.names())
            )
            raise ConfigError(f"{name} is not a MultiBERTs model; nearest: {_fmt(near)} (names are seed_0 .. seed_24)")
        return int(m[1])

    @classmethod
    def grid(cls, name: str) -> tuple[int, ...]:
        return cls.steps if cls.parse(name) in cls.intermediate_seeds else (cls.final_step,)

    @classmethod
    def checkpoint(cls, name: str, step: int, *, final: bool = False) -> Checkpoint:
        seed = cls.parse(name)
        grid = cls.grid(name)
        if step not in grid:
            extra = "" if seed in cls.intermediate_seeds else " (seeds 5-24 only have the final model)"
            raise ConfigError(
                f"step {step} is not in the multiberts grid of {name}{extra};"
                f" nearest: {_fmt(_nearest_steps(step, grid))}"
            )
        if final or seed not in cls.intermediate_seeds:
            if step != cls.final_step:
                raise ConfigError(f"the final MultiBERTs model is step {cls.final_step}, not {step}")
            repo = f"{cls.org}/multiberts-seed_{seed}"
        else:
            repo = f"{cls.org}/multiberts-seed_{seed}-step_{step // 1000}k"
        return Checkpoint(
            family=cls.family,
            model=name,
            step=step,
            tokens_seen=step * cls.tokens_per_step,
            seed=seed,
            repo_id=repo,
            revision="main",
        )

    @classmethod
    def resolve(cls, name: str, steps: Any) -> list[Checkpoint]:
        grid = cls.grid(name)
        final = isinstance(steps, str) and steps.strip().lower() in ("final", "last")
        where = f"the multiberts grid of {name}"
        if cls.parse(name) not in cls.intermediate_seeds:
            where += " (seeds 5-24 only have the final model)"
        return [cls.checkpoint(name, s, final=final) for s in select_steps(steps, grid, where)]

    @classmethod
    def resolve_entry(cls, entry: Mapping[str, Any], **_: Any) -> list[Checkpoint]:
        return cls.resolve(entry["name"], entry.get("steps"))

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return cls.final_step

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        return 110.0  # BERT-base


# ---------------------------------------------------------------------------------------------- other Hub suites


class _HubSuite:
    """A Hub suite with a fixed list of models sharing one published step grid; a subclass names its models
    (with their parameter counts), grid, tokens per step, and the repo and revision of a step."""

    family = ""
    title = ""
    models: Mapping[str, float] = {}  # name -> million parameters
    steps: tuple[int, ...] = ()
    tokens_per_step: int = 0
    entry_keys = ("family", "name", "steps")
    checks_before_fetch = True

    @classmethod
    def names(cls) -> list[str]:
        return list(cls.models)

    @classmethod
    def parse(cls, name: str) -> None:
        if name not in cls.models:
            raise ConfigError(
                f"{name} is not one of the {cls.title} models; nearest: {_fmt(_nearest_names(name, cls.names()))}"
                f" (models: {_fmt(cls.names())})"
            )

    @classmethod
    def seed_of(cls, name: str) -> int | None:
        return None

    @classmethod
    def repo_id(cls, name: str, step: int) -> str:
        raise NotImplementedError

    @classmethod
    def revision(cls, name: str, step: int) -> str:
        return "main"

    @classmethod
    def checkpoint(cls, name: str, step: int) -> Checkpoint:
        cls.parse(name)
        if step not in cls.steps:
            raise ConfigError(
                f"step {step} is not in the {cls.family} grid; nearest: {_fmt(_nearest_steps(step, cls.steps))}"
            )
        return Checkpoint(
            family=cls.family,
            model=name,
            step=step,
            tokens_seen=step * cls.tokens_per_step,
            seed=cls.seed_of(name),
            repo_id=cls.repo_id(name, step),
            revision=cls.revision(name, step),
        )

    @classmethod
    def resolve(cls, name: str, steps: Any) -> list[Checkpoint]:
        cls.parse(name)
        return [cls.checkpoint(name, s) for s in select_steps(steps, cls.steps, f"the {cls.family} grid")]

    @classmethod
    def resolve_entry(cls, entry: Mapping[str, Any], **_: Any) -> list[Checkpoint]:
        return cls.resolve(entry["name"], entry.get("steps"))

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return cls.steps[-1]

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        return cls.models[ckpt.model]


class _AllenAISuite(_HubSuite):
    """AI2's OLMo runs: ``allenai/{name}``, one branch per checkpoint named ``{branch_prefix}step{N}-tokens{T}B``.
    T is a rounded token count that no formula of N reproduces exactly, so the revision is a pattern and fetch
    looks the branch up (anisweep.fetch.match_branch). ``seed`` is the runs', 6198."""

    branch_prefix = ""

    @classmethod
    def seed_of(cls, name: str) -> int | None:
        return 6198

    @classmethod
    def repo_id(cls, name: str, step: int) -> str:
        return f"allenai/{name}"

    @classmethod
    def revision(cls, name: str, step: int) -> str:
        return f"{cls.branch_prefix}step{step}-tokens*B"


class OLMo(_AllenAISuite):
    """AI2 OLMo 1 (``OlmoForCausalLM``): ``allenai/OLMo-1B-hf``, branches ``step{N}-tokens{T}B``. The grid is the
    351 checkpoints of the run's published list (``grids.OLMO_1B_STEPS``), 1000 to 738020; 2048 sequences x
    2048 tokens per step."""

    family = "olmo"
    title = "OLMo"
    models = {"OLMo-1B-hf": 1176.764416}
    steps = grids.OLMO_1B_STEPS
    tokens_per_step = 2048 * 2048  # 4,194,304


class OLMo2(_AllenAISuite):
    """AI2 OLMo 2 (``Olmo2ForCausalLM``): ``allenai/OLMo-2-0425-1B``, its stage-1 pretraining checkpoints as
    branches ``stage1-step{N}-tokens{T}B``. The grid is the run's published stage-1 list
    (``grids.OLMO2_0425_1B_STEPS``: 0, 300, 10000, ..., 1907359); 512 sequences x 4096 tokens per step. Stage 2
    (the annealing that gives ``main``) is not catalogued."""

    family = "olmo2"
    title = "OLMo 2"
    models = {"OLMo-2-0425-1B": 1484.916736}
    steps = grids.OLMO2_0425_1B_STEPS
    tokens_per_step = 512 * 4096  # 2,097,152
    branch_prefix = "stage1-"


class MistralGPT2(_HubSuite):
    """Stanford CRFM's Mistral GPT-2 runs (``GPT2LMHeadModel``): five GPT-2 small and five GPT-2 medium seeds,
    ``stanford-crfm/{name}``, branch ``checkpoint-{N}``, the same 609 steps each (``grids.MISTRAL_STEPS``);
    512 sequences x 1024 tokens per step. ``seed`` is the run's (the ``x{seed}`` of its name)."""

    family = "gpt2"
    title = "Mistral GPT-2"
    models = {
        **{
            f"{run}-gpt2-small-x{seed}": 124.439808
            for run, seed in zip(
                ("alias", "battlestar", "caprica", "darkmatter", "expanse"), (21, 49, 81, 343, 777), strict=True
            )
        },
        **{
            f"{run}-gpt2-medium-x{seed}": 354.823168
            for run, seed in zip(
                ("arwen", "beren", "celebrimbor", "durin", "eowyn"), (21, 49, 81, 343, 777), strict=True
            )
        },
    }
    steps = grids.MISTRAL_STEPS
    tokens_per_step = 512 * 1024  # 524,288

    @classmethod
    def seed_of(cls, name: str) -> int | None:
        return int(name.rsplit("-x", 1)[1])

    @classmethod
    def repo_id(cls, name: str, step: int) -> str:
        return f"stanford-crfm/{name}"

    @classmethod
    def revision(cls, name: str, step: int) -> str:
        return f"checkpoint-{step}"


class TinyLlama(_HubSuite):
    """TinyLlama 1.1B (``LlamaForCausalLM``, grouped-query attention: 32 query heads, 4 key/value heads): seven
    intermediate checkpoints, one repository each (revision ``main``), under the ids the project README links.
    Step = the ``{k}k`` of the repository name x 1000; 1024 sequences x 2048 tokens per step."""

    family = "tinyllama"
    title = "TinyLlama"
    models = {"TinyLlama-1.1B": 1100.048384}
    repos = {
        50_000: "PY007/TinyLlama-1.1B-step-50K-105b",
        240_000: "PY007/TinyLlama-1.1B-intermediate-step-240k-503b",
        480_000: "PY007/TinyLlama-1.1B-intermediate-step-480k-1T",
        715_000: "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T",
        955_000: "TinyLlama/TinyLlama-1.1B-intermediate-step-955k-token-2T",
        1_195_000: "TinyLlama/TinyLlama-1.1B-intermediate-step-1195k-token-2.5T",
        1_431_000: "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
    }
    steps = tuple(repos)
    tokens_per_step = 1024 * 2048  # 2,097,152

    @classmethod
    def repo_id(cls, name: str, step: int) -> str:
        return cls.repos[step]


# ---------------------------------------------------------------------------------------------- local runs

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_name(name: Any, family: str) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ConfigError(
            f"{family} model name {name!r} must be a plain folder name (letters, digits, '.', '_', '-'):"
            " it names results/{family}/{model}/"
        )
    return name


class LocalRun:
    """A training run on disk: ``{path}/step{N}/`` or Trainer-style ``{path}/checkpoint-{N}/`` folders.

    ``tokens_seen`` = step * ``tokens_per_step`` when the entry gives it; otherwise the Trainer's
    ``trainer_state.json`` ``num_input_tokens_seen`` when present and positive; otherwise ``None``.
    The tokenizer is looked up at fetch time in the checkpoint folder, then in the run folder.
    """

    family = "local"
    tokens_per_step = None  # the run's own: the entry's tokens_per_step, or the Trainer's count
    entry_keys = ("family", "name", "steps", "path", "tokens_per_step", "seed", "tokenizer", "live")
    checks_before_fetch = True  # before the weights are hashed: a large run's are GBs to read
    patterns = ("step{N}/", "checkpoint-{N}/")
    _DIR = re.compile(r"(?:step|checkpoint-)(\d+)")

    @classmethod
    def discover(cls, path: Path) -> dict[int, Path]:
        """Map step -> checkpoint folder."""
        found: dict[int, Path] = {}
        for child in sorted(path.iterdir()):
            m = cls._DIR.fullmatch(child.name)
            if m is None or not child.is_dir():
                continue
            step = int(m[1])
            if step in found:
                raise ConfigError(f"step {step} appears twice in {path}: {found[step].name}/ and {child.name}/")
            found[step] = child
        return dict(sorted(found.items()))

    @staticmethod
    def _trainer_tokens(folder: Path) -> int | None:
        state = folder / "trainer_state.json"
        if not state.is_file():
            return None
        try:
            n = json.loads(state.read_text()).get("num_input_tokens_seen")
        except (OSError, ValueError):
            return None
        return int(n) if isinstance(n, (int, float)) and n > 0 else None

    @classmethod
    def resolve_entry(cls, entry: Mapping[str, Any], **_: Any) -> list[Checkpoint]:
        if entry.get("live"):
            from .live_local import resolve_live

            return resolve_live(
                entry["name"], entry.get("path"), entry.get("steps"), entry.get("tokens_per_step"), entry.get("seed")
            )
        return cls.resolve(
            entry["name"],
            entry.get("path"),
            entry.get("steps"),
            entry.get("tokens_per_step"),
            entry.get("seed"),
            entry.get("tokenizer"),
        )

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return max(steps)

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        """From the checkpoint's config.json (embeddings + 12 d^2 per layer); 1B when it cannot be read."""
        try:
            hf = json.loads((Path(ckpt.path or "") / "config.json").read_text())
            d, layers, vocab = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
        except (OSError, ValueError, KeyError, TypeError):
            return 1000.0
        return (12 * layers * d * d + 2 * vocab * d) / 1e6

    @classmethod
    def resolve(
        cls,
        name: str,
        path: Any,
        steps: Any,
        tokens_per_step: Any = None,
        seed: Any = None,
        tokenizer: Any = None,
    ) -> list[Checkpoint]:
        _check_name(name, cls.family)
        if path is None:
            raise ConfigError(f"local run {name!r} needs a 'path' (the run folder holding step{{N}}/ subfolders)")
        root = Path(str(path)).expanduser()
        if not root.is_dir():
            raise ConfigError(f"local run {name!r}: path {root} is not a folder")
        if tokens_per_step is not None:
            tokens_per_step = _as_int(tokens_per_step, "tokens_per_step")
        if seed is not None:
            seed = _as_int(seed, "seed")
        found = cls.discover(root)
        if not found:
            seen = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())[:8]
            raise ConfigError(
                f"local run {name!r}: no checkpoints in {root}; expected subfolders named"
                f" {' or '.join(cls.patterns)} (N = the optimizer step)"
                + (f"; found: {_fmt(seen)}" if seen else "; the folder is empty")
            )
        chosen = select_steps(steps, list(found), f"the checkpoints of {name} in {root}")
        out = []
        for step in chosen:
            folder = found[step]
            tokens = step * tokens_per_step if tokens_per_step is not None else cls._trainer_tokens(folder)
            out.append(
                Checkpoint(
                    family=cls.family,
                    model=name,
                    step=step,
                    tokens_seen=tokens,
                    seed=seed,
                    path=str(folder),
                    tokenizer=None if tokenizer is None else str(tokenizer),
                )
            )
        return out


class Toy:
    """Toy models the pipeline trains: ``toy_root/{name}/step{N}/``; ``toy_specs[name]`` holds the run's
    ``steps`` (list or ``{start, stop, every}``; the saved grid), ``batch_size`` and ``seq_len``
    (tokens per step = batch_size * seq_len) and optionally ``seed``. The folders need not exist yet."""

    family = "toy"
    tokens_per_step = None  # batch_size * seq_len of the toy's spec
    entry_keys = ("family", "name", "steps")
    checks_before_fetch = False  # checked against the config before it is trained (anisweep.config)

    @classmethod
    def resolve_entry(
        cls, entry: Mapping[str, Any], toy_root: Path | None = None, toy_specs: Mapping[str, Any] | None = None
    ) -> list[Checkpoint]:
        return cls.resolve(entry["name"], entry.get("steps"), toy_root, toy_specs)

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return max(steps)

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        return 1.0

    @classmethod
    def resolve(
        cls, name: str, steps: Any, toy_root: Path | None, toy_specs: Mapping[str, Any] | None
    ) -> list[Checkpoint]:
        _check_name(name, cls.family)
        specs = toy_specs or {}
        if name not in specs:
            known = list(specs)
            raise ConfigError(
                f"{name} is not a toy model"
                + (f"; nearest: {_fmt(_nearest_names(name, known))}" if known else "; no toy models are defined")
            )
        spec = specs[name]
        if toy_root is None:
            raise ConfigError(f"toy model {name!r}: no toy_root given (where the toy checkpoints are written)")
        for key in ("steps", "batch_size", "seq_len"):
            if key not in spec:
                raise ConfigError(f"toy model {name!r}: its spec lacks {key!r} (needs steps, batch_size, seq_len)")
        grid = _toy_grid(spec["steps"], name)
        tps = _as_int(spec["batch_size"], f"{name}.batch_size") * _as_int(spec["seq_len"], f"{name}.seq_len")
        seed = spec.get("seed")
        seed = None if seed is None else _as_int(seed, f"{name}.seed")
        root = Path(toy_root)
        return [
            Checkpoint(
                family=cls.family,
                model=name,
                step=s,
                tokens_seen=s * tps,
                seed=seed,
                path=str(root / name / f"step{s}"),
            )
            for s in select_steps(steps, grid, f"the steps of toy model {name}")
        ]


def _toy_grid(spec: Any, name: str) -> list[int]:
    """A toy spec's own ``steps``: a list of ints or a generating range ``{start, stop, every}``."""
    if isinstance(spec, Mapping):
        start = _as_int(spec.get("start", 0), f"{name}.steps.start")
        stop = _as_int(spec["stop"], f"{name}.steps.stop") if "stop" in spec else None
        every = _as_int(spec.get("every", 1), f"{name}.steps.every")
        if stop is None or every <= 0 or stop < start:
            raise ConfigError(f"toy model {name!r}: steps {dict(spec)} needs start <= stop and every > 0")
        return list(range(start, stop + 1, every))
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)) and spec:
        return sorted({_as_int(s, f"{name}.steps") for s in spec})
    raise ConfigError(f"toy model {name!r}: steps must be a list of steps or {{start, stop, every}}, got {spec!r}")


# ---------------------------------------------------------------------------------------------- entry points

# The registry: every family class carries its own facts (entry keys, resolution, the trusted final step,
# its size for resource requests). A new checkpoint suite is one class here and one line in FAMILIES.
FAMILIES: dict[str, type] = {
    cls.family: cls for cls in (Pythia, MultiBERTs, OLMo, OLMo2, MistralGPT2, TinyLlama, LocalRun, Toy)
}
_ALL_KEYS = sorted({k for cls in FAMILIES.values() for k in cls.entry_keys})


def family_of(name: Any) -> type:
    """The catalogue class of a family name; a ConfigError names the nearest known ones."""
    if name not in FAMILIES:
        raise ConfigError(
            f"family {name!r} is unknown; nearest: {_fmt(_nearest_names(str(name), FAMILIES, 2))}"
            f" (families: {_fmt(FAMILIES)})"
        )
    return FAMILIES[name]


def tokens_per_step(family: str) -> int | None:
    """Tokens per optimizer step of a Hub family; ``None`` for local/toy (they depend on the run)."""
    return family_of(family).tokens_per_step


def _check_keys(entry: Mapping[str, Any], cls: type, name: str) -> None:
    valid = cls.entry_keys
    for key in entry:
        if key in valid:
            continue
        # Keys meant for this file (a typo such as 'step', or tokens_per_step on a Hub family) are errors;
        # other keys belong to later stages of the pipeline and are left to the config schema.
        if key in _ALL_KEYS:
            raise ConfigError(
                f"key {key!r} is not used for family {cls.family} (entry {name!r}); valid keys: {_fmt(valid)}"
                + (f"; tokens per step is fixed at {cls.tokens_per_step}" if key == "tokens_per_step" else "")
            )
        near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.75)
        if near:
            raise ConfigError(
                f"key {key!r} of {cls.family} entry {name!r} is unknown; nearest: {near[0]} (valid keys: {_fmt(valid)})"
            )


def resolve(
    entry: Mapping[str, Any], toy_root: Path | None = None, toy_specs: Mapping[str, Any] | None = None
) -> list[Checkpoint]:
    """Expand one ``models`` entry of the config into its checkpoints (validated, sorted by step)."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"a models entry must be a mapping with family, name, steps; got {entry!r}")
    cls = family_of(entry.get("family"))
    name = entry.get("name")
    if name is None:
        raise ConfigError(f"a {cls.family} entry needs a 'name'")
    _check_keys(entry, cls, str(name))
    return cls.resolve_entry({**entry, "name": str(name)}, toy_root=toy_root, toy_specs=toy_specs)


def resolve_all(
    models: Iterable[Mapping[str, Any]],
    toy_root: Path | None = None,
    toy_specs: Mapping[str, Any] | None = None,
) -> list[Checkpoint]:
    """Every checkpoint of a config's ``models`` list, in config order, each ``key`` once.

    The same checkpoint listed twice is kept once; two different checkpoints under one key (e.g. the
    MultiBERTs ``-step_2000k`` repo and the ``final`` repo of one seed, or two local runs of one name)
    are a :class:`ConfigError`: their results would land in the same folder.
    """
    seen: dict[str, Checkpoint] = {}
    for entry in models or ():
        for ckpt in resolve(entry, toy_root=toy_root, toy_specs=toy_specs):
            old = seen.get(ckpt.key)
            if old is not None and old != ckpt:
                raise ConfigError(
                    f"{ckpt.key} is listed twice with different sources: {_source(old)} and {_source(ckpt)};"
                    " give one of the entries another name"
                )
            seen.setdefault(ckpt.key, ckpt)
    return list(seen.values())


def _source(ckpt: Checkpoint) -> str:
    where = ckpt.repo_id or ckpt.path
    return where if ckpt.tokenizer is None else f"{where} (tokenizer {ckpt.tokenizer})"


def final_step(checkpoints: Sequence[Checkpoint]) -> int:
    """The step whose weights are trusted when several steps of one model share them: the published final
    model for Hub families (Pythia's defective branches serve it under earlier names), else the last step."""
    return family_of(checkpoints[0].family).trusted_step([c.step for c in checkpoints])


def params_millions(ckpt: Checkpoint) -> float:
    """About how many million parameters a checkpoint has, for memory and time requests."""
    return family_of(ckpt.family).params_millions(ckpt)
