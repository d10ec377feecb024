"""The toy models the pipeline trains itself, under `toy_root/{name}/step{N}/`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anisweep.checkpoints.base import Checkpoint, as_int, check_name, listing, nearest_names, select_steps
from anisweep.errors import ConfigError


class Toy:
    """Toy models the pipeline trains: ``toy_root/{name}/step{N}/``; ``toy_specs[name]`` holds the run's
    ``steps`` (list or ``{start, stop, every}``; the saved grid), ``batch_size`` and ``seq_len``
    (tokens per step = batch_size * seq_len) and optionally ``seed``. The folders need not exist yet."""

    family = "toy"
    tokens_per_step = None  # batch_size * seq_len of the toy's spec
    entry_keys = ("family", "name", "steps")
    checks_before_fetch = False  # checked against the config before it is trained (anisweep.config)
    one_entry_per_model = True  # two entries of one toy are a config error, not a silent union of their steps

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
        check_name(name, cls.family)
        specs = toy_specs or {}
        if name not in specs:
            known = list(specs)
            raise ConfigError(
                f"{name} is not a toy model"
                + (f"; nearest: {listing(nearest_names(name, known))}" if known else "; no toy models are defined")
            )
        spec = specs[name]
        if toy_root is None:
            raise ConfigError(f"toy model {name!r}: no toy_root given (where the toy checkpoints are written)")
        for key in ("steps", "batch_size", "seq_len"):
            if key not in spec:
                raise ConfigError(f"toy model {name!r}: its spec lacks {key!r} (needs steps, batch_size, seq_len)")
        grid = _toy_grid(spec["steps"], name)
        tps = as_int(spec["batch_size"], f"{name}.batch_size") * as_int(spec["seq_len"], f"{name}.seq_len")
        seed = spec.get("seed")
        seed = None if seed is None else as_int(seed, f"{name}.seed")
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
        start = as_int(spec.get("start", 0), f"{name}.steps.start")
        stop = as_int(spec["stop"], f"{name}.steps.stop") if "stop" in spec else None
        every = as_int(spec.get("every", 1), f"{name}.steps.every")
        if stop is None or every <= 0 or stop < start:
            raise ConfigError(f"toy model {name!r}: steps {dict(spec)} needs start <= stop and every > 0")
        return list(range(start, stop + 1, every))
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)) and spec:
        return sorted({as_int(s, f"{name}.steps") for s in spec})
    raise ConfigError(f"toy model {name!r}: steps must be a list of steps or {{start, stop, every}}, got {spec!r}")
