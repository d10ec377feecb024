"""What the backward pass keeps (anisweep.tangent.backward): per site float64 sums over the valid tokens per
frequency stratum (SiteSums), and a seeded sample of tokens (GradientPass). Read back from Parquet
(anisweep.tangent.pass_tables), they are all the shares, fits and controls need: no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from anisweep.moments import merge, safe

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
    `n_act` counts the tokens whose activation is not zero (`act_unit`'s). `grad_second` is sum_t g_t g_t^T;
    `grad_m2` the same of g_t minus their mean, over the tokens with a gradient: each mini-batch's about its own
    mean, merged by Chan et al.'s update (anisweep.moments), so that the covariance never comes from
    grad_second / n - mean mean^T, which cancels where the mean is large against the spread."""

    d: int
    device: torch.device | str = "cpu"
    n: np.ndarray = field(init=False)
    n_grad: np.ndarray = field(init=False)
    n_act: np.ndarray = field(init=False)
    grad_sum: np.ndarray = field(init=False)
    grad_second: np.ndarray = field(init=False)
    grad_m2: np.ndarray = field(init=False)
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
            "grad_m2": zeros(self.d, self.d),
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
            self._merge_m2(index, g[rows & (g_norm[:, 0] > 0)])
            sums["n"][index] += gs.shape[0]
            sums["n_grad"][index] += (g_norm[rows] > 0).sum()
            sums["n_act"][index] += (a_norm[rows] > 0).sum()
            sums["grad_sum"][index] += gs.sum(0)
            sums["grad_second"][index] += gs.T @ gs
            sums["grad_unit"][index] += g_unit[rows].sum(0)
            sums["act_unit"][index] += a_unit[rows].sum(0)
            sums["grad_norm"][index] += g_norm[rows].sum()

    def _merge_m2(self, index: int, g: torch.Tensor) -> None:
        """Merge the scatter about their own mean of one mini-batch's gradients `g` (those with a gradient) of
        stratum `index` into grad_m2; before n_grad and grad_sum take them in."""
        sums = self._sums
        n = torch.tensor(float(len(g)), dtype=torch.float64, device=g.device)
        mean = g.sum(0) / safe(n)
        dev = g - mean
        n_a = sums["n_grad"][index]
        sums["grad_m2"][index] = merge(
            n_a, sums["grad_sum"][index] / safe(n_a), sums["grad_m2"][index], n, mean, dev.T @ dev, outer=True
        )[2]

    @classmethod
    def of(cls, **arrays: np.ndarray) -> SiteSums:
        """Finished sums from their arrays (`all` first, then the strata), as read back from Parquet."""
        sums = object.__new__(cls)
        sums.d, sums.device = arrays["grad_sum"].shape[1], "cpu"
        for name, value in arrays.items():
            setattr(sums, name, value)
        return sums

    def finish(self) -> SiteSums:
        per_stratum = {name: value.cpu().numpy() for name, value in self._sums.items()}
        for name, value in with_all(per_stratum).items():
            setattr(self, name, value)
        self.n, self.n_grad, self.n_act = (x.astype(np.int64) for x in (self.n, self.n_grad, self.n_act))
        return self


def with_all(per_stratum: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each quantity with `all` first, as STRATA lists them: the strata's sum, and for grad_m2 their scatters
    merged (Chan et al.) about the mean of every token with a gradient."""
    out = {name: np.concatenate([value.sum(0, keepdims=True), value]) for name, value in per_stratum.items()}
    n, total, m2 = 0.0, np.zeros_like(per_stratum["grad_sum"][0]), np.zeros_like(per_stratum["grad_m2"][0])
    for count, part_sum, part_m2 in zip(per_stratum["n_grad"], per_stratum["grad_sum"], per_stratum["grad_m2"]):
        m2 = merge(n, total / safe(n), m2, count, part_sum / safe(count), part_m2, outer=True)[2]
        n, total = n + count, total + part_sum
    out["grad_m2"][0] = m2
    return out


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
