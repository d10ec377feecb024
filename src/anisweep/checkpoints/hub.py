"""The Hub suites, one small catalogue class each (repo ids, revisions, step grids, tokens per step)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from anisweep.checkpoints import grids
from anisweep.checkpoints.base import Checkpoint, listing, nearest_names, nearest_steps, select_steps
from anisweep.checkpoints.preflight import ModelShape
from anisweep.errors import ConfigError

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
    # (hidden_size, num_hidden_layers, num_attention_heads) of each size's config.json; -deduped and -seed{n}
    # share their size's
    shapes = {
        "14m": ModelShape(128, 6, 4),
        "31m": ModelShape(256, 6, 8),
        "70m": ModelShape(512, 6, 8),
        "160m": ModelShape(768, 12, 12),
        "410m": ModelShape(1024, 24, 16),
        "1b": ModelShape(2048, 16, 8),
        "1.4b": ModelShape(2048, 24, 16),
        "2.8b": ModelShape(2560, 32, 32),
        "6.9b": ModelShape(4096, 32, 32),
        "12b": ModelShape(5120, 36, 40),
    }

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
                f"{name} is not a Pythia model; nearest: {listing(nearest_names(name, cls.names()))}"
                f" (sizes: {listing(cls.sizes)}; variants: -deduped, -seed1..-seed9)"
            )
        size = m["size"]
        if m["deduped"] and size not in cls.deduped_sizes:
            deduped = [f"pythia-{s}-deduped" for s in cls.deduped_sizes]
            raise ConfigError(
                f"{name} does not exist: pythia-{size} has no -deduped variant;"
                f" nearest: pythia-{size}, {listing(nearest_names(name, deduped, 2))}"
            )
        if m["seed"] is not None:
            seed = int(m["seed"])
            near = [f"pythia-{size}"]
            if size not in cls.seed_sizes:
                if seed in cls.seeds:
                    near.append(f"pythia-410m-seed{seed}")
                raise ConfigError(
                    f"{name} does not exist: seed variants (PolyPythias, seeds 1-9) exist only for"
                    f" {listing(cls.seed_sizes)}; nearest: {listing(near)}"
                )
            if seed not in cls.seeds:
                near.insert(0, f"pythia-{size}-seed{min(cls.seeds, key=lambda s: abs(s - seed))}")
                raise ConfigError(f"{name} does not exist: PolyPythias seeds are 1-9; nearest: {listing(near)}")
            return seed
        return cls.original_seed

    @classmethod
    def checkpoint(cls, name: str, step: int) -> Checkpoint:
        seed = cls.parse(name)
        if step not in cls.steps:
            near = listing(nearest_steps(step, cls.steps))
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

    @classmethod
    def shape(cls, name: str) -> ModelShape:
        cls.parse(name)
        return cls.shapes[cls._NAME.fullmatch(name)["size"]]


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
                else nearest_names(name, cls.names())
            )
            raise ConfigError(
                f"{name} is not a MultiBERTs model; nearest: {listing(near)} (names are seed_0 .. seed_24)"
            )
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
                f" nearest: {listing(nearest_steps(step, grid))}"
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

    @classmethod
    def shape(cls, name: str) -> ModelShape:
        return ModelShape(768, 12, 12)  # BERT-base


class _HubSuite:
    """A Hub suite with a fixed list of models sharing one published step grid; a subclass names its models
    (with their parameter counts), grid, tokens per step, and the repo and revision of a step."""

    family = ""
    title = ""
    models: Mapping[str, float] = {}  # name -> million parameters
    shapes: Mapping[str, ModelShape] = {}  # name -> its config.json's hidden size, layers and query heads
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
                f"{name} is not one of the {cls.title} models; nearest: {listing(nearest_names(name, cls.names()))}"
                f" (models: {listing(cls.names())})"
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
                f"step {step} is not in the {cls.family} grid; nearest: {listing(nearest_steps(step, cls.steps))}"
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

    @classmethod
    def shape(cls, name: str) -> ModelShape | None:
        return cls.shapes.get(name)


class _AllenAISuite(_HubSuite):
    """AI2's OLMo runs: ``allenai/{name}``, one branch per checkpoint named ``{branch_prefix}step{N}-tokens{T}B``.
    T is a rounded token count that no formula of N reproduces exactly, so the revision is a pattern and fetch
    looks the branch up (anisweep.checkpoints.fetch.match_branch). ``seed`` is the runs', 6198."""

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
    shapes = {"OLMo-1B-hf": ModelShape(2048, 16, 16)}
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
    shapes = {"OLMo-2-0425-1B": ModelShape(2048, 16, 16)}
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
    shapes = {name: ModelShape(768, 12, 12) if "-small-" in name else ModelShape(1024, 24, 16) for name in models}
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
    shapes = {"TinyLlama-1.1B": ModelShape(2048, 22, 32)}  # 32 query heads (4 key/value heads)
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
