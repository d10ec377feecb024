"""The user's stream measures during extract's forward pass (anisweep.measures.registry): per measure and site (or,
for a measure that reads its sites together, per measure and layer) an accumulator, fed mini-batch by mini-batch
by the Recorder, and its rows at the end, one table per measure (`measures/{name}.parquet` in the checkpoint's
folder)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import polars as pl
import torch

from anisweep.adapters import Geometry
from anisweep.measures.registry import Measure, MeasureError, Site, matches, measure_frame, taken
from anisweep.measures.sites import ATTENTION_STREAM_SITES


class StreamMeasures:
    """Each mini-batch gets a fresh accumulator per (measure, layer, site), `update`d with that batch's activations
    and `merge`d into the running one, so that update sees one batch and merge is what spans them. A measure that
    reads its sites together waits, within a batch, until every site it listens at in that layer has arrived (the
    Recorder says beforehand which sites each layer has: `expect`)."""

    def __init__(self, measures: Sequence[Measure], geometry: Geometry, where: str):
        self.measures = list(measures)
        self.geometry = geometry
        self.where = where
        self.running: dict[tuple[str, int, str], object] = {}
        self.expected: dict[int, list[str]] = {}
        self.pending: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.scaling: dict[int, float] = {}
        self._listening: dict[str, list[Measure]] = {}
        self.widths: dict[tuple[int, str], int] = {}  # hidden sites not d_model wide (ALBERT's embedding)

    def expect(self, layer: int, site: str, width: int | None = None) -> None:
        """The forward pass will feed `site` at `layer` in every mini-batch; `width`, where its vectors are not
        d_model wide."""
        if width is not None:
            self.widths[(layer, site)] = width
        sites = self.expected.setdefault(layer, [])
        if site not in sites:
            sites.append(site)

    def listening(self, site: str) -> list[Measure]:
        if site not in self._listening:
            self._listening[site] = [m for m in self.measures if m.listens(site)]
        return self._listening[site]

    def wants(self, site: str) -> bool:
        return bool(self.listening(site))

    def feed(self, layer: int, site: str, x: torch.Tensor, valid: torch.Tensor, scaling: float | None = None) -> None:
        """x: (B, T, d_model) at a hidden site, (B, H, T, d_head) at q, k and attention_output, (B, H, T, T) at
        attention_scores and attention_probs; valid (B, T). `scaling`: the layer's score scale, at its attention
        sites."""
        if scaling is not None:
            self.scaling[layer] = float(scaling)
        for measure in self.listening(site):
            if not measure.together:
                self._update(measure, layer, (site,), x, valid)
                continue
            got = self.pending.setdefault((measure.name, layer), {})
            got[site] = x
            needed = self._needed(measure, layer)
            if len(got) == len(needed):
                del self.pending[(measure.name, layer)]
                self._update(measure, layer, needed, {s: got[s] for s in needed}, valid)

    def end_batch(self) -> None:
        """Every measure that reads its sites together has been fed every one of them in this batch."""
        if self.pending:
            (name, layer), got = next(iter(self.pending.items()))
            measure = next(m for m in self.measures if m.name == name)
            missing = sorted(set(self._needed(measure, layer)) - set(got))
            raise MeasureError(
                f"measure {name!r} ({measure.entry}) at {self.where}: layer {layer} fed {sorted(got)} but not "
                f"{missing} in one mini-batch"
            )

    def _needed(self, measure: Measure, layer: int) -> tuple[str, ...]:
        """The sites of `layer` the measure listens at, in the order it names them."""
        sites = self.expected.get(layer, ())
        return tuple(dict.fromkeys(site for pattern in measure.sites for site in sites if matches(pattern, site)))

    def _update(self, measure: Measure, layer: int, sites: tuple[str, ...], x, valid: torch.Tensor) -> None:
        name = "+".join(sites)
        key = (measure.name, layer, name)
        with self._blame(measure, f"layer {layer} {name}"):
            part = measure.target(self.site(layer, name, sites))
            part.update(x, valid)
            if key in self.running:
                self.running[key].merge(part)
            else:
                self.running[key] = part

    def site(self, layer: int, name: str, sites: tuple[str, ...]) -> Site:
        g = self.geometry
        at_attention = any(s in ATTENTION_STREAM_SITES for s in sites)
        return Site(
            name=name,
            layer=layer,
            d_model=max((self.widths.get((layer, s), g.d_model) for s in sites), default=g.d_model),
            n_heads=g.n_heads,
            d_head=g.d_head,
            n_layers=g.n_layers,
            kv_heads=g.kv_heads,
            causal=g.is_causal(layer),
            scaling=self.scaling.get(layer) if at_attention else None,
            rotary_dims=g.rotary_dims,
            sites=sites,
        )

    def tables(self, ident: dict) -> dict[str, pl.DataFrame]:
        """`measures/{name}` -> the measure's rows over every site it listened at; a site's layer and name fill
        the rows that leave them out."""
        out = {}
        for measure in self.measures:
            frames = []
            for (name, layer, site), accumulator in sorted(self.running.items()):
                if name != measure.name:
                    continue
                with self._blame(measure, f"layer {layer} {site}"):
                    rows = taken(accumulator.finalize())
                frames.append(measure_frame(measure, ident, rows, defaults={"layer": layer, "site": site}))
            if not frames:
                raise MeasureError(
                    f"measure {measure.name!r} ({measure.entry}) at {self.where}: no site it listens at "
                    f"({list(measure.sites)}) was seen in this model"
                )
            out[f"measures/{measure.name}"] = pl.concat(frames)
        return out

    @contextlib.contextmanager
    def _blame(self, measure: Measure, at: str):
        """Re-raise any exception of the measure's own code as a MeasureError naming it, the checkpoint and site."""
        try:
            yield
        except MeasureError:
            raise
        except Exception as error:
            where = f"measure {measure.name!r} ({measure.entry}) failed at {self.where}, {at}"
            raise MeasureError(f"{where}: {type(error).__name__}: {error}") from error


def attention_maps(
    query: torch.Tensor, key: torch.Tensor, scaling: float, valid: torch.Tensor, causal: bool, bias=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, probabilities), (B, H, T, T) in float32: scaling q k^T with -inf where the key is padding or, causal,
    later than the query, and their softmax over the keys, 0 at hidden keys and in the rows of padding queries."""
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
    if bias is not None:  # T5's relative position bias: part of the pre-softmax scores
        scores = scores + bias.float()
    t = scores.shape[-1]
    visible = valid[:, None, None, :].bool()
    if causal:
        visible = visible & torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0) * valid[:, None, :, None]
    return scores, probs
