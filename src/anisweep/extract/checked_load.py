"""`from_pretrained`, with every weight accounted for: a checkpoint is analysed with its own weights or not at all.

transformers fills a tensor the checkpoint lacks (or has in another shape) with a random initialisation and
only logs a load report. Here any missing, mismatched or unexpected tensor is a WeightsError naming the tensors
and the folder, raised before the model runs. One exception: the head, every tensor outside the base model, may be
initialised where the caller allows it and the checkpoint holds none of it (a checkpoint of the base model alone);
the base model that runs is then whole, the caller is told which tensors are random (`Loaded.initialised`) and
warned. Part of a head missing is a damaged checkpoint: an error.
Unexpected keys that transformers ignores by design (its `_keys_to_ignore_on_load_unexpected`, e.g. BERT's
pooler in an MLM checkpoint) are left out of its report already.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

SHOWN = 12  # tensors named per kind in an error


class WeightsError(ValueError):
    """A checkpoint's weight files do not hold exactly the tensors its model class has."""


class Loaded(NamedTuple):
    model: nn.Module
    initialised: tuple[str, ...]  # the head's tensors the checkpoint lacked, randomly initialised
    ignored: tuple[str, ...]  # the checkpoint's tensors of another architecture's head, not loaded


def _names(keys) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def _outside_base(model: nn.Module, key: str) -> bool:
    """Whether a parameter name of `model` lies outside its base model (an LM head's)."""
    base = getattr(model, "base_model", model)
    if base is model:
        return False
    return not key.startswith(f"{model.base_model_prefix}.")


def _head_parameters(model: nn.Module) -> list[str]:
    """The parameters outside the base model (the head's), each once (a tied one under its first name)."""
    return [name for name, _ in model.named_parameters() if _outside_base(model, name)]


def _foreign_head(model: nn.Module, key: str) -> bool:
    """Whether an unexpected key, met loading a base model from a checkpoint of another class, belongs to that
    class's head: not under any module of the base model."""
    if getattr(model, "base_model", model) is not model:
        return False
    top = key.removeprefix(f"{model.base_model_prefix}.").split(".")[0]
    return top not in dict(model.named_children())


def load_checked(
    cls: Any, path: str | Path, *, head_may_be_initialised: bool, head_needed_by: str = "", **kwargs
) -> Loaded:
    """`cls.from_pretrained(path, **kwargs)`; a WeightsError unless every tensor of the model came from `path`'s
    weight files and every tensor there was loaded. `head_may_be_initialised`: a head (the tensors outside the base
    model) the checkpoint lacks whole is allowed (initialised, named in `Loaded.initialised`, warned about);
    otherwise `head_needed_by` says in the error what needs it and what to do instead."""
    model, info = cls.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    missing = set(info.get("missing_keys") or ())
    head = {key for key in missing if _outside_base(model, key)} if head_may_be_initialised else set()
    if not set(_head_parameters(model)) <= head:
        head = set()  # part of a head is a damaged checkpoint, not one saved without its head
    unexpected = set(info.get("unexpected_keys") or ())
    foreign = {key for key in unexpected if _foreign_head(model, key)}
    problems = []
    if missing - head:
        problems.append(f"missing (they would be random): {_names(missing - head)}")
        if head_needed_by and all(_outside_base(model, key) for key in missing):
            problems[-1] += f", the LM head, which {head_needed_by}"
    if unexpected - foreign:
        problems.append(f"unexpected (not in {type(model).__name__}): {_names(unexpected - foreign)}")
    mismatched = info.get("mismatched_keys") or ()
    if mismatched:
        shapes = [f"{key} {tuple(saved)} where the model has {tuple(want)}" for key, saved, want in mismatched]
        problems.append(f"of another shape: {_names(shapes)}")
    if info.get("error_msgs"):
        problems.append("load errors: " + "; ".join(map(str, info["error_msgs"])))
    if problems:
        raise WeightsError(
            f"the weight files in {path} do not match {type(model).__name__} (its config.json): "
            + "; ".join(problems)
            + ". The files are incomplete or another model's: save the checkpoint again (or fetch it again)"
        )
    if head:
        warnings.warn(
            f"{path} holds no {_names(head)}: {type(model).__name__} initialised them at random; the base model "
            "that runs is complete, and nothing read from these tensors is reported (extract.json: "
            "initialised_tensors)",
            stacklevel=2,
        )
    if foreign:
        warnings.warn(
            f"{path} holds {_names(foreign)}, the head of another architecture than {type(model).__name__}: "
            "not loaded (extract.json: ignored_tensors)",
            stacklevel=2,
        )
    return Loaded(model, tuple(sorted(head)), tuple(sorted(foreign)))
