"""Streamed means and variances that do not cancel: each part (a mini-batch, a stratum) gives its count, its mean
and M2, the sum of squared deviations from its own mean, and the parts are merged in float64 by the pairwise
update of Chan, Golub & LeVeque (1979),

    n = n_a + n_b,  delta = mean_b - mean_a,  mean = mean_a + delta n_b / n,
    M2 = M2_a + M2_b + delta^2 n_a n_b / n,

never as sum x^2 / n - mean^2, which loses as many digits as mean^2 / variance has (a rogue dimension of mean 31.5
and variance 1e-2: five of float32's seven). The functions take numpy arrays or torch tensors alike (counts that
broadcast against the means) and read no value back, so that a GPU never waits.
"""

from __future__ import annotations


def safe(n):
    """n, with 1 where it is 0: the divisor of a mean whose part may hold nothing (its sums are then 0). n is a count
    (whole, >= 0), so that this is n at least 1: one op on a device, where n + (n == 0) takes two."""
    clamp_min = getattr(n, "clamp_min", None)
    return n + (n == 0) if clamp_min is None else clamp_min(1)


def merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b, outer: bool = False):
    """(n, mean, M2) of parts a and b together. With `outer` the M2s are scatter matrices, sum_i (x_i - mean)
    (x_i - mean)^T of vectors, and their spread term delta delta^T."""
    n = n_a + n_b
    share = n_b / safe(n)
    delta = mean_b - mean_a
    spread = delta[..., :, None] * delta[..., None, :] if outer else delta * delta
    return n, mean_a + delta * share, m2_a + m2_b + spread * (n_a * share)


def merged_m2(n_a, sum_a, m2_a, n_b, sum_b, m2_b):
    """M2 of parts a and b together, each given by its count, its sum and its M2 (the means are sum / n): merge's M2,
    by the same ops in the same order, without the mean it does not need."""
    delta = sum_b / safe(n_b) - sum_a / safe(n_a)
    return m2_a + m2_b + delta * delta * (n_a * (n_b / safe(n_a + n_b)))


def pooled_m2(n, total, m2):
    """M2 of several parts together, each given by its count, its sum and its M2 about its own mean (1-d arrays or
    tensors, one entry a part): sum M2_i + sum n_i (mean_i - mean)^2, without cancellation."""
    mean = total.sum() / safe(n.sum())
    return m2.sum() + (n * (total / safe(n) - mean) ** 2).sum()
