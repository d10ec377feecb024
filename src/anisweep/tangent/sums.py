"""What the backward pass keeps (anisweep.tangent.backward): per site float64 sums over the valid tokens per
frequency stratum (SiteSums), and a seeded sample of tokens (GradientPass). Read back from Parquet
(anisweep.tangent.pass_tables), they are all the shares, fits and controls need: no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

#: `all` is the strata's sum; then the tokens by their id's count (anisweep.tangent.batch.frequency_strata), and
#: the special tokens apart
STRATA = ("all", "frequent", "middle", "rare", "special")


@dataclass
class SiteSums:
    """float64 sums over the valid tokens of one site per frequency stratum, accumulated on the model's device;
    `finish()` gives them as numpy arrays indexed by STRATA (`all` being the strata's sum).

    `n` counts the valid tokens; `n_grad` those whose gradient is not zero, the tokens the gradient statistics
    are over (a zero vector has no direction: as geometry.unit_sum, it is left out, not counted). At an encoder's
    final sites only the masked targets have a gradient, at a decoder's the last position of a sequence has none.
    `n_act` counts the tokens whose activation is not zero (`act_unit`'s)."""

    d: int
    device: torch.device | str = "cpu"
    n: np.ndarray = field(init=False)
    n_grad: np.ndarray = field(init=False)
    n_act: np.ndarray = field(init=False)
    grad_sum: np.ndarray = field(init=False)
    grad_second: np.ndarray = field(init=False)
    grad_unit: np.ndarray = field(init=False)
    act_unit: np.ndarray = field(init=False)
    grad_norm: np.ndarray = field(init=False)

    def __post_init__(self):
        zeros = lambda *shape: torch.zeros(len(STRATA) - 1, *shape, dtype=torch.float64, device=self.device)  # noqa: E731
        self._sums = {
            "n": zeros(),
            "n_grad": zeros(),
            "n_act": zeros(),
            "grad_sum": zeros(self.d),
            "grad_second": zeros(self.d, self.d),
            "grad_unit": zeros(self.d),
            "act_unit": zeros(self.d),
            "grad_norm": zeros(),
        }

    def add(self, act: torch.Tensor, grad: torch.Tensor, stratum: torch.Tensor) -> None:
        """act, grad: (n, d) of valid tokens; stratum (n,) in 0..3 (frequent, middle, rare, special)."""
        a, g = act.double(), grad.double()
        stratum = stratum.to(g.device)
        g_norm = g.norm(dim=1, keepdim=True)
        a_norm = a.norm(dim=1, keepdim=True)
        g_unit = g / g_norm.clamp_min(1e-300)  # zero where the gradient is zero
        a_unit = a / a_norm.clamp_min(1e-300)
        sums = self._sums
        for index in range(len(STRATA) - 1):
            rows = stratum == index
            gs = g[rows]
            sums["n"][index] += gs.shape[0]
            sums["n_grad"][index] += (g_norm[rows] > 0).sum()
            sums["n_act"][index] += (a_norm[rows] > 0).sum()
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
        self.n, self.n_grad, self.n_act = (x.astype(np.int64) for x in (self.n, self.n_grad, self.n_act))
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
