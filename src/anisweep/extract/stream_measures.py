"""The user's stream measures during extract's forward pass (anisweep.measures.registry): per measure and site
an accumulator, fed mini-batch by mini-batch by the Recorder, and its rows at the end, one table per measure
(`measures/{name}.parquet` in the checkpoint's folder)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import polars as pl
import torch

from anisweep.adapters import Geometry
from anisweep.measures.registry import Measure, MeasureError, Site, measure_frame


class StreamMeasures:
    """Each mini-batch gets a fresh accumulator per (measure, site), `update`d with that batch's activations
    and `merge`d into the running one, so that update sees one batch and merge is what spans them."""

    def __init__(self, measures: Sequence[Measure], geometry: Geometry, where: str):
        self.measures = list(measures)
        self.geometry = geometry
        self.where = where
        self.running: dict[tuple[str, int, str], object] = {}
        self._listening: dict[str, list[Measure]] = {}

    def listening(self, site: str) -> list[Measure]:
        if site not in self._listening:
            self._listening[site] = [m for m in self.measures if m.listens(site)]
        return self._listening[site]

    def feed(self, layer: int, site: str, x: torch.Tensor, valid: torch.Tensor) -> None:
        """x: (B, T, d_model) at a hidden site, (B, H, T, d_head) at q, k and attention_output; valid (B, T)."""
        for measure in self.listening(site):
            g = self.geometry
            key = (measure.name, layer, site)
            with self._blame(measure, f"layer {layer} {site}"):
                part = measure.target(Site(site, layer, g.d_model, g.n_heads, g.d_head))
                part.update(x, valid)
                if key in self.running:
                    self.running[key].merge(part)
                else:
                    self.running[key] = part

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
                    rows = accumulator.finalize()
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
