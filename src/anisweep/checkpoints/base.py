"""A checkpoint (the pipeline's unit of work) and the step selection every family shares."""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from anisweep.errors import ConfigError


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
    # The `hub` family (any repository; anisweep.checkpoints.hub_repo) only; left out of to_dict() at their defaults,
    # so that the other families' identities (extract's recorded params) are what they were.
    subfolder: str | None = None  # the folder inside the repo that holds the checkpoint (Trainer's checkpoint-{N}/)
    commit: str | None = None  # the commit the revision resolved to when the config was read (fetch is pinned to it)
    files_id: str | None = None  # a subfolder checkpoint's content: a digest of its files' blob ids
    trust_remote_code: bool = False  # the entry allows the repo's own modelling code (config.json's auto_map)

    @property
    def key(self) -> str:
        """``{family}/{model}/step{step}``: the Snakemake wildcards and the results sub-folder."""
        return f"{self.family}/{self.model}/step{self.step}"

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in HUB_ONLY:
            if out[key] == self.__dataclass_fields__[key].default:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Checkpoint:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k not in HUB_ONLY or d.get(k) is not None})


#: the fields only the `hub` family sets, absent from to_dict() at their defaults
HUB_ONLY = ("subfolder", "commit", "files_id", "trust_remote_code")


def nearest_names(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    choices = list(choices)
    near = difflib.get_close_matches(str(value), choices, n=n, cutoff=0.0)
    return near or choices[:n]


def nearest_steps(step: int, grid: Sequence[int]) -> list[int]:
    """The grid steps just below and just above ``step`` (one of them when it lies outside the grid)."""
    i = bisect.bisect_left(grid, step)
    return [grid[j] for j in (i - 1, i) if 0 <= j < len(grid)]


def listing(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def as_int(value: Any, what: str) -> int:
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
            f"steps: {spec!r} is not a step selection; nearest: {listing(nearest_names(word, ['all', 'final']))}"
            " (or a list of steps, or {start, stop, every})"
        )
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in _RANGE_KEYS]
        if unknown:
            k = unknown[0]
            raise ConfigError(
                f"steps range has unknown key {k!r}; valid keys: {listing(_RANGE_KEYS)}"
                f" (nearest: {listing(nearest_names(str(k), _RANGE_KEYS, 1))})"
            )
        start = as_int(spec.get("start", grid[0]), "steps.start")
        stop = as_int(spec.get("stop", grid[-1]), "steps.stop")
        every = as_int(spec.get("every", 1), "steps.every")
        if every <= 0:
            raise ConfigError(f"steps.every must be positive, got {every}")
        if stop < start:
            raise ConfigError(f"steps range stop={stop} is below start={start}")
        chosen = [s for s in grid if start <= s <= stop and (s - start) % every == 0]
        if not chosen:
            raise ConfigError(
                f"steps range {{start: {start}, stop: {stop}, every: {every}}} selects no step of {where};"
                f" nearest: {listing(nearest_steps(start, grid))}"
            )
        return chosen
    if isinstance(spec, (int, str)) and not isinstance(spec, bool):
        spec = [spec]
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        if not spec:
            raise ConfigError(f"steps: empty list for {where}")
        out = []
        for raw in spec:
            step = as_int(raw, "each listed step")
            if step not in grid:
                raise ConfigError(f"step {step} is not in {where}; nearest: {listing(nearest_steps(step, grid))}")
            out.append(step)
        return sorted(set(out))
    raise ConfigError(f"steps: {spec!r} is not 'all', 'final', a list of steps, or {{start, stop, every}}")


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: Any, family: str) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ConfigError(
            f"{family} model name {name!r} must be a plain folder name (letters, digits, '.', '_', '-'):"
            " it names results/{family}/{model}/"
        )
    return name
