"""What hierarchical vision transformers (MiT, CvT) share: blocks numbered straight through their stages, and a
geometry whose heads and their width change from stage to stage."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from anisweep.adapters.base import Geometry

if TYPE_CHECKING:
    from torch import nn


def numbered_blocks(stages: Iterable[Sequence[nn.Module]]) -> list[tuple[int, int, nn.Module]]:
    """(stage, layer, block) of every block, its layer counted through the stages (each stage given as its blocks)."""
    out = []
    for s, blocks in enumerate(stages):
        for block in blocks:
            out.append((s, len(out), block))
    return out


def staged_geometry(heads: Sequence[int], widths: Sequence[int], depths: Sequence[int]) -> Geometry:
    """Per stage its query heads, its width and its number of blocks: the per-layer geometry."""
    layer_heads = tuple(h for h, depth in zip(heads, depths) for _ in range(depth))
    layer_d_head = tuple(w // h for w, h, depth in zip(widths, heads, depths) for _ in range(depth))
    return Geometry(
        n_layers=len(layer_heads),
        n_heads=max(layer_heads),
        d_model=widths[-1],
        d_head=max(layer_d_head),
        rotary_dims=0,
        causal=False,
        layer_heads=layer_heads,
        layer_d_head=layer_d_head,
    )
