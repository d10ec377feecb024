"""Which pairs of checkpoints the config's `compare` section names, and where their tables go; no numerics, so that
the workflow reads it when it plans the jobs.

Roles (the `role` column of compare.parquet): `final`, each step against the model's last; `previous`, each step
against the step before it in the sweep; `step`, each step against a named step; `seed`, a model against another
model of its family at every step both have; `layers`, a checkpoint's layers against each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from anisweep.errors import ConfigError


@dataclass(frozen=True)
class Pair:
    """One comparison: `model` at `step` against `ref_model` at `ref_step`, in `role`."""

    family: str
    model: str
    step: int
    ref_model: str
    ref_step: int
    role: str

    @property
    def path(self) -> str:
        folder = f"results/{self.family}/{self.model}/step{self.step}/compare"
        if self.role == "layers":
            return f"{folder}/layers.parquet"
        return f"{folder}/{self.ref_model}.step{self.ref_step}.parquet"


def pairs(section: Mapping, steps: Mapping[tuple[str, str], Iterable[int]]) -> list[Pair]:
    """Every pair the `compare` section names over the models' steps ({(family, model): steps}); a named step that
    a model lacks, or a seed pair that is not two models of one family sharing a step, is a ConfigError."""
    if not section.get("enabled", True):
        return []
    steps = {key: sorted(set(value)) for key, value in steps.items()}
    _check_layer_steps(section.get("layer_steps", ()), steps)
    found = []
    for (family, model), grid in steps.items():
        found += _within(family, model, grid, section.get("against", ()))
        found += [Pair(family, model, s, model, s, "layers") for s in _layer_steps(section, grid)]
    for names in section.get("seeds", ()):
        found += _seeds(names, steps)
    return list(dict.fromkeys(found))


def _within(family: str, model: str, grid: list[int], against: Iterable) -> list[Pair]:
    found = []
    for choice in against:
        if choice == "final":
            found += [Pair(family, model, s, model, grid[-1], "final") for s in grid[:-1]]
        elif choice == "previous":
            found += [Pair(family, model, s, model, p, "previous") for p, s in zip(grid, grid[1:], strict=False)]
        else:
            if choice not in grid:
                raise ConfigError(
                    f"compare.against: step {choice} is not a step of {family}/{model} (its steps: {_listed(grid)}); "
                    "name one of them, or `final` / `previous`"
                )
            found += [Pair(family, model, s, model, choice, "step") for s in grid if s != choice]
    return found


def _check_layer_steps(named: Iterable, steps: Mapping[tuple[str, str], list[int]]) -> None:
    """A step number in layer_steps that no model sweeps would compute nothing: a ConfigError naming it."""
    swept = sorted({s for grid in steps.values() for s in grid})
    unswept = [s for s in named if s not in ("first", "final") and s not in swept]
    if unswept:
        models = ", ".join(f"{family}/{model}" for family, model in steps)
        raise ConfigError(
            f"compare.layer_steps: step {', '.join(map(str, unswept))} is not a step of any model swept ({models}; "
            f"their steps: {_listed(swept)}); name one of them, or `first` / `final`"
        )


def _layer_steps(section: Mapping, grid: list[int]) -> list[int]:
    chosen = {"first": grid[0], "final": grid[-1]}
    return sorted({chosen.get(s, s) for s in section.get("layer_steps", ()) if chosen.get(s, s) in grid})


def _seeds(names: list[str], steps: Mapping[tuple[str, str], list[int]]) -> list[Pair]:
    a, b = names
    where = f"compare.seeds: [{a}, {b}]"
    families = {name: [f for f, m in steps if m == name] for name in names}
    missing = [name for name, found in families.items() if not found]
    if missing:
        raise ConfigError(f"{where}: {missing} not among the models swept ({sorted(m for _, m in steps)}); add them")
    shared = sorted(set(families[a]) & set(families[b]))
    if a == b or not shared:
        raise ConfigError(f"{where}: name two models of one family (families {families[a]} and {families[b]})")
    family = shared[0]
    common = sorted(set(steps[(family, a)]) & set(steps[(family, b)]))
    if not common:
        raise ConfigError(f"{where}: the two models share no step; sweep some steps of both")
    return [Pair(family, a, s, b, s, "seed") for s in common]


def _listed(grid: list[int]) -> str:
    return ", ".join(map(str, grid)) if len(grid) <= 12 else f"{', '.join(map(str, grid[:6]))}, ..., {grid[-1]}"


def of_model(all_pairs: Iterable[Pair], family: str, model: str) -> list[Pair]:
    """The pairs whose rows land in the model's compare.parquet: those of its checkpoints."""
    return [p for p in all_pairs if p.family == family and p.model == model]


def roles(pairs: Iterable[Pair]) -> list[tuple[str, str]]:
    """(role, path) of every role each pair plays, sorted: one table in several roles (a step's `previous` that
    is also the named `step`) gives its rows to compare.parquet once per role."""
    return sorted({(p.role, p.path) for p in pairs}, key=lambda rp: (rp[1], rp[0]))
