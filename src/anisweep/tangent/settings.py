"""The gradient analysis's settings (config section `gradients`, defaults from the schema)."""

from __future__ import annotations

from dataclasses import dataclass

from anisweep import schema

_DEFAULTS = schema.defaults("gradients")


#: the fitted subspaces: semi-NMF of the raw activations (the tangent proxy), and its references, PCA of the
#: centred and of the raw activations (semi-NMF must beat the uncentred one to add anything to low-rank geometry)
SUBSPACES = ("seminmf", "pca", "pca_uncentred")


@dataclass
class GradientSettings:
    """The config's `gradients` section; the defaults are the schema's (anisweep/config.schema.yaml)."""

    enabled: bool = _DEFAULTS["enabled"]
    layers: list[int] | None = _DEFAULTS["layers"]  # residual-stream layers; None: 0, n_layers // 2 (and n_layers)
    final_ln: bool = _DEFAULTS["final_ln"]
    rank: int | list[int] = _DEFAULTS["rank"]
    n_random: int = _DEFAULTS["n_random"]
    sample_tokens: int = _DEFAULTS["sample_tokens"]
    mlm_probability: float = _DEFAULTS["mlm_probability"]
    max_iter: int = _DEFAULTS["max_iter"]
    seed: int = _DEFAULTS["seed"]
    steps: list[int] | None = _DEFAULTS["steps"]
    subspaces: str = _DEFAULTS["subspaces"]  # per_checkpoint | fixed | both
    fit_window: list[int] | None = _DEFAULTS["fit_window"]
    embedding_change: bool = _DEFAULTS["embedding_change"]
    embedding_tokens: int = _DEFAULTS["embedding_tokens"]

    def ranks(self) -> list[int]:
        return sorted({self.rank} if isinstance(self.rank, int) else set(self.rank))
