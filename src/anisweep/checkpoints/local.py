"""A user's own run: saved checkpoints in `step{N}/` or `checkpoint-{N}/` folders (LocalRun), or a run analysed
while it trained (`live: true`), whose callback wrote extract's tables into `{path}/step{N}/` (resolve_live).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anisweep.checkpoints.base import Checkpoint, as_int, check_name, listing, select_steps
from anisweep.errors import ConfigError
from anisweep.tables import EXTRACT_TABLES


class LocalRun:
    """A training run on disk: ``{path}/step{N}/`` or Trainer-style ``{path}/checkpoint-{N}/`` folders.

    ``tokens_seen`` = step * ``tokens_per_step`` when the entry gives it; otherwise the Trainer's
    ``trainer_state.json`` ``num_input_tokens_seen`` when present and positive; otherwise ``None``.
    The tokenizer is looked up at fetch time in the checkpoint folder, then in the run folder.
    """

    family = "local"
    tokens_per_step = None  # the run's own: the entry's tokens_per_step, or the Trainer's count
    entry_keys = ("family", "name", "steps", "path", "tokens_per_step", "seed", "tokenizer", "live")
    checks_before_fetch = True  # the config.json and tokenizer against the extract settings (preflight)
    one_entry_per_model = True  # two entries of one name may be two runs: a config error, never merged
    patterns = ("step{N}/", "checkpoint-{N}/")
    _DIR = re.compile(r"(?:step|checkpoint-)(\d+)")
    _NEAR = re.compile(r"(?:step|checkpoint)[-_. ]?(\d+)", re.IGNORECASE)  # step-20, step_30, Step20, ...

    @classmethod
    def discover(cls, path: Path) -> dict[int, Path]:
        """Map step -> checkpoint folder."""
        found: dict[int, Path] = {}
        for child in sorted(path.iterdir()):
            m = cls._DIR.fullmatch(child.name)
            if m is None and child.is_dir() and (near := cls._NEAR.fullmatch(child.name)):
                raise ConfigError(
                    f"{path}: folder {child.name}/ is not named step{{N}}/ or checkpoint-{{N}}/ (N = the optimizer "
                    f"step), so it would be skipped; rename it step{int(near[1])}/, or move it out of {path}"
                )
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
    def resolve_entry(cls, entry: Mapping[str, Any], extract: Mapping | None = None, **_: Any) -> list[Checkpoint]:
        if entry.get("live"):
            return resolve_live(
                entry["name"],
                entry.get("path"),
                entry.get("steps"),
                entry.get("tokens_per_step"),
                entry.get("seed"),
                extract,
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
        check_name(name, cls.family)
        if path is None:
            raise ConfigError(f"local run {name!r} needs a 'path' (the run folder holding step{{N}}/ subfolders)")
        root = Path(str(path)).expanduser()
        if not root.is_dir():
            raise ConfigError(f"local run {name!r}: path {root} is not a folder")
        if tokens_per_step is not None:
            tokens_per_step = as_int(tokens_per_step, "tokens_per_step")
        if seed is not None:
            seed = as_int(seed, "seed")
        found = cls.discover(root)
        if not found:
            seen = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())[:8]
            raise ConfigError(
                f"local run {name!r}: no checkpoints in {root}; expected subfolders named"
                f" {' or '.join(cls.patterns)} (N = the optimizer step)"
                + (f"; found: {listing(seen)}" if seen else "; the folder is empty")
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


FAMILY = "local"


def extract_names() -> list[str]:
    return [*(f"{name}.parquet" for name in EXTRACT_TABLES), "extract.json"]


def default_path(name: str) -> Path:
    """Where AnisweepCallback(results="results") writes run `name`: the workflow's own results folder for it."""
    return Path("results") / FAMILY / name


def run_folder(entry: dict) -> Path:
    return Path(str(entry["path"])).expanduser() if entry.get("path") else default_path(str(entry["name"]))


def missing_step_hint(step: int) -> str:
    """What to do about a live local run's step whose files are missing."""
    return f"run AnisweepCallback (or analyse_live) at step {step}, or leave step {step} out of the entry's steps"


def resolve_live(
    name: str,
    path: Any,
    steps: Any,
    tokens_per_step: Any = None,
    seed: Any = None,
    extract: Mapping | None = None,
) -> list[Checkpoint]:
    """The analysed steps of a live local run: `steps: all` / `final` among the step{N}/ folders holding an
    extract.json; a listed step whose folder lacks extract's files is a ConfigError. tokens_seen and seed are the
    ones the callback wrote (extract.json's checkpoint), else step * tokens_per_step and the entry's seed. The
    chosen steps must have been analysed with the same settings, the config's `extract` ones when given
    (check_live_settings)."""
    check_name(name, FAMILY)
    root = run_folder({"name": name, "path": path})
    where = f"local run {name!r} (live)"
    if not root.is_dir():
        raise ConfigError(
            f"{where}: {root} is not a folder; analyse the run with anisweep.live's AnisweepCallback "
            f"(results=..., run_name={name!r}) first, or set the entry's path to the folder it wrote"
        )
    if tokens_per_step is not None:
        tokens_per_step = as_int(tokens_per_step, "tokens_per_step")
    if seed is not None:
        seed = as_int(seed, "seed")
    folders = LocalRun.discover(root)
    analysed = [step for step, folder in folders.items() if (folder / "extract.json").is_file()]
    if not analysed:
        raise ConfigError(
            f"{where}: no step{{N}}/ folder of {root} holds an extract.json; run AnisweepCallback (or analyse_live) "
            "at the steps to sweep, or set the entry's path to the folder it wrote"
        )
    word = steps.strip().lower() if isinstance(steps, str) else None
    grid = analysed if word in ("all", "final", "last") else list(folders)
    chosen = select_steps(steps, grid, f"the analysed steps of {name} in {root}")
    out = []
    for step in chosen:
        folder = folders[step]
        missing = [n for n in extract_names() if not (folder / n).is_file()]
        if missing:
            raise ConfigError(f"{where}: {folder} lacks {', '.join(missing)}; {missing_step_hint(step)}")
        written = _checkpoint_of(_extract_json(folder / "extract.json"))
        tokens = written.get("tokens_seen")
        if tokens is None and tokens_per_step is not None:
            tokens = step * tokens_per_step
        out.append(
            Checkpoint(
                family=FAMILY,
                model=name,
                step=step,
                tokens_seen=tokens,
                seed=seed if seed is not None else written.get("seed"),
                path=str(folder),
            )
        )
    check_live_settings(out, extract)
    return out


def _extract_json(info: Path) -> dict:
    try:
        written = json.loads(info.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{info} cannot be read ({error}); run the callback at that step again") from None
    return written if isinstance(written, dict) else {}


def _checkpoint_of(written: dict) -> dict:
    checkpoint = written.get("checkpoint") or {}
    return checkpoint if isinstance(checkpoint, dict) else {}


# The extract settings that change a step's tables: the evaluation batch, the samples, the histogram's bins and
# the dtype. Not device, threads, batch_size or attention (the same numbers, up to rounding).
SAME_SETTINGS = ("n_sequences", "seq_len", "seed", "sample_tokens", "qk_sample_tokens", "score_bins", "dtype")


def _steps(steps: Sequence[int]) -> str:
    return f"step{'s' if len(steps) > 1 else ''} {listing(steps)}"


def check_live_settings(checkpoints: Sequence[Checkpoint], extract: Mapping | None = None) -> None:
    """The steps of each live local run among `checkpoints` were analysed with the same SAME_SETTINGS (their
    extract.json's settings), and with the config's `extract` section's when it is given (completed, as
    config.complete fills it): else a ConfigError naming the steps, the key and the values. A key an older
    extract.json, or `extract`, lacks is not compared."""
    runs: dict[str, list[Checkpoint]] = {}
    for c in checkpoints:
        runs.setdefault(c.model, []).append(c)
    for name, steps in runs.items():
        where = f"local run {name!r} (live)"
        written = {c.step: _extract_json(Path(str(c.path)) / "extract.json").get("settings") or {} for c in steps}
        for key in SAME_SETTINGS:
            groups = _by_value({step: settings[key] for step, settings in written.items() if key in settings})
            if len(groups) > 1:
                raise ConfigError(
                    f"{where}: its steps were analysed with different extract.{key}: "
                    + "; ".join(f"{_steps(s)} with {key} = {v!r}" for v, s in groups)
                    + "; their tables are not comparable. Analyse these steps again with the same settings "
                    "(AnisweepCallback's or analyse_live's settings=ExtractSettings(...)), or leave the odd ones out "
                    "of the entry's steps"
                )
            if groups and extract is not None and key in extract:
                _check_against_config(where, key, groups[0], extract)


def _by_value(values: Mapping[int, Any]) -> list[tuple[Any, list[int]]]:
    """(value, the steps that have it), in step order; a list since values may be dicts (score_bins)."""
    groups: list[tuple[Any, list[int]]] = []
    for step, value in sorted(values.items()):
        group = next((g for g in groups if g[0] == value), None)
        if group is None:
            groups.append((value, [step]))
        else:
            group[1].append(step)
    return groups


def _check_against_config(where: str, key: str, group: tuple[Any, list[int]], extract: Mapping) -> None:
    value, steps = group
    wanted = extract[key]
    if value != wanted:
        raise ConfigError(
            f"{where}: {_steps(steps)} analysed with extract.{key} = {value!r}, but the config has extract.{key} "
            f"= {wanted!r}; set extract.{key}: {json.dumps(value)} in the config, or analyse these steps again with "
            f"ExtractSettings({key}={wanted!r})"
        )


def missing_gradients(
    checkpoints: Sequence[Checkpoint], steps: Sequence[int] | None, names: Sequence[str] = ("gradient_sums.parquet",)
) -> list[Path]:
    """The step folders among `checkpoints` the gradient analysis covers (`gradients.steps`, all when None)
    that lack one of the backward pass's tables `names` (analyse_live with gradients enabled writes them)."""
    return [
        Path(c.path)
        for c in checkpoints
        if (steps is None or c.step in steps) and not all((Path(c.path) / name).is_file() for name in names)
    ]
