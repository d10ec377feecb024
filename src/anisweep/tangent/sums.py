"""What the backward pass keeps (anisweep.tangent.backward): per site float64 sums over the valid tokens per
frequency stratum (SiteSums), and a seeded sample of tokens (GradientPass). Read back from Parquet
(anisweep.tangent.pass_tables), they are all the shares, fits and controls need: no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SiteSums:
    """float64 sums over the valid tokens of one site per frequency stratum, accumulated on the model's device;
    `finish()` gives them as numpy arrays indexed by STRATA (`all` being the strata's sum)."""

    d: int
    device: torch.device | str = "cpu"
    n: np.ndarray = field(init=False)
    grad_sum: np.ndarray = field(init=False)
    grad_second: np.ndarray = field(init=False)
    grad_unit: np.ndarray = field(init=False)
    act_unit: np.ndarray = field(init=False)
    grad_norm: np.ndarray = field(init=False)

    def __post_init__(self):
        zeros = lambda *shape: torch.zeros(3, *shape, dtype=torch.float64, device=self.device)  # noqa: E731
        self._sums = {
            "n": zeros(),
            "grad_sum": zeros(self.d),
            "grad_second": zeros(self.d, self.d),
            "grad_unit": zeros(self.d),
            "act_unit": zeros(self.d),
            "grad_norm": zeros(),
        }

    def add(self, act: torch.Tensor, grad: torch.Tensor, stratum: torch.Tensor) -> None:
        """act, grad: (n, d) of valid tokens; stratum (n,) in 0..2 (0 frequent, 1 middle, 2 rare)."""
        a, g = act.double(), grad.double()
        stratum = stratum.to(g.device)
        g_norm = g.norm(dim=1, keepdim=True)
        g_unit = g / g_norm.clamp_min(1e-300)
        a_unit = a / a.norm(dim=1, keepdim=True).clamp_min(1e-300)
        sums = self._sums
        for index in range(3):
            rows = stratum == index
            gs = g[rows]
            sums["n"][index] += gs.shape[0]
            sums["grad_sum"][index] += gs.sum(0)
            sums["grad_second"][index] += gs.T @ gs
            sums["grad_unit"][index] += g_unit[rows].sum(0)
            sums["act_unit"][index] += a_unit[rows].sum(0)
            sums["grad_norm"][index] += g_norm[rows].sum()

    @classmethod
    def of(cls, **arrays: np.ndarray) -> SiteSums:
        """Finished sums from their arrays (`all` first, then the strata), as read back from Parquet."""
        sums = object.__new__(cls)
        sums.d, sums.device = arrays["grad_sum"].shape[1], "cpu"
        for name, value in arrays.items():
            setattr(sums, name, value)
        return sums

    def finish(self) -> SiteSums:
        for name, value in self._sums.items():
            per_stratum = value.cpu().numpy()
            setattr(self, name, np.concatenate([per_stratum.sum(0, keepdims=True), per_stratum]))
        self.n = self.n.astype(np.int64)
        return self


@dataclass
class GradientPass:
    """What the pass keeps: per site the sums and the sampled tokens' activations and gradients."""

    sites: list  # anisweep.tangent.backward.GradientSite: the modules read (none when read back from Parquet)
    sums: dict[tuple[int, str], SiteSums]
    act_sample: dict[tuple[int, str], np.ndarray]
    grad_sample: dict[tuple[int, str], np.ndarray]
    sample_strata: np.ndarray
    loss: float
    n_targets: int
    strata_info: dict
    seconds: float
