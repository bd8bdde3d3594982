"""A threshold with a certificate: Learn then Test with fixed-sequence testing (NumPy/SciPy only).

The gate evicts iff D ≥ τ (PAGE §3, Eq. 2); the gated arm harms an input at budget b when its score
falls below the full-KV score (Table 27), which happens only where the gate opens and plain
eviction harms. Learn then Test (Angelopoulos, Bates, Candès, Jordan and Lei, 2021) turns the choice
of τ into multiple testing: each candidate τ carries the null hypothesis H0(τ): "harm(τ) > A", a
valid p-value from labelled calibration inputs, and a family-wise error control at δ; every τ whose
null is rejected has harm ≤ A, with probability ≥ 1 − δ over the calibration draw.

Here the candidates are every distinct D among the calibration inputs, walked from the safest
(highest τ, fewest inputs evicted) down, and fixed-sequence testing rejects them in that order until
the first p-value above δ: because the order is fixed before the data's harm labels are read, each
test may use the full δ (Bauer 1991; LTT §3.2). The p-value of H0(τ) is the exact binomial tail
P(Bin(n, A) ≤ x(τ)), x(τ) the calibration inputs with D ≥ τ whose plain score is below their full
score, n all calibration inputs (LTT's binomial p-value, their Eq. 9 family).

References
----------
A. N. Angelopoulos, S. Bates, E. J. Candès, M. I. Jordan, L. Lei (2021), "Learn then Test:
Calibrating predictive algorithms to achieve risk control", arXiv:2110.01052, §2, §3.2.
P. Bauer (1991), "Multiple testing in clinical trials", Statistics in Medicine 10.
PAGE paper: §3 (Eq. 2, the gate), Table 27 (harm at a fixed budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from pagestats.stats._results import _Result

__all__ = ["Certificate", "fixed_sequence_threshold"]


@dataclass(frozen=True)
class Certificate(_Result):
    """The certified τ of :func:`fixed_sequence_threshold` and the test that gave it.

    ``tau`` is None when not even the highest candidate was rejected: no τ is certified, and the
    gate never opens. ``n_harmed``/``harm``/``p_value``/``p_open`` are at the certified τ (0 and
    None without one); ``stopped_at``/``stopped_p_value`` are the first candidate not rejected (None
    when every candidate was).
    """

    tau: float | None
    harm_bound: float
    delta: float
    n: int
    n_harmed: int
    harm: float
    p_value: float | None
    p_open: float
    n_rejected: int
    n_candidates: int
    stopped_at: float | None
    stopped_p_value: float | None
    method: str = "Learn then Test, fixed-sequence from the highest tau; binomial p-value P(Bin(n, A) <= x)"


def fixed_sequence_threshold(drops, harmed, *, harm_bound: float, delta: float) -> Certificate:
    """The lowest τ certified to keep the gated harm ≤ ``harm_bound`` with probability ≥ 1 − ``delta``.

    Parameters
    ----------
    drops : array_like of float
        D of each calibration input (finite).
    harmed : array_like of bool
        Whether plain eviction harms that input at the budget: its plain score is below its full
        score. The gated arm harms it iff also D ≥ τ.
    harm_bound : float
        A, the largest harm rate tolerated, in (0, 1).
    delta : float
        δ, the probability allowed that the certified τ's harm exceeds A, in (0, 1).

    Returns
    -------
    Certificate

    Notes
    -----
    Candidates τ₁ > τ₂ > … are the distinct D values. x(τ) = #{i : D_i ≥ τ, harmed_i}, and
    p(τ) = P(Bin(n, A) ≤ x(τ)) (``scipy.stats.binom.cdf``), a valid p-value of H0 "harm(τ) > A"
    for n exchangeable calibration inputs. Walking down, the first p(τ_j) > δ stops the walk; the
    certified τ is τ_{j−1}. Since x(τ) only grows as τ falls, so does p(τ), and the walk is the
    longest prefix whose p-values are ≤ δ. The guarantee is over the calibration draw and is
    about the harm rate of the population the calibration inputs were drawn from.
    """
    d = np.asarray(drops, dtype=np.float64)
    h = np.asarray(harmed)
    if d.ndim != 1 or h.shape != d.shape or d.size == 0:
        raise ValueError(f"drops and harmed must be two 1-D arrays of one non-zero length, got {d.shape} and {h.shape}")
    if h.dtype != bool:
        raise TypeError(f"harmed must be Boolean, got dtype {h.dtype}")
    if not np.all(np.isfinite(d)):
        raise ValueError("drops must be finite")
    for name, value in (("harm_bound", harm_bound), ("delta", delta)):
        if isinstance(value, bool) or not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    a, dl, n = float(harm_bound), float(delta), int(d.size)
    candidates = np.unique(d)[::-1]                           # highest τ first
    harmed_drops = np.sort(d[h])
    x = harmed_drops.size - np.searchsorted(harmed_drops, candidates, side="left")   # #{harmed, D ≥ τ}
    p = binom.cdf(x, n, a)
    above = np.flatnonzero(p > dl)
    n_rejected = int(above[0]) if above.size else candidates.size
    stop = None if n_rejected == candidates.size else n_rejected
    if n_rejected == 0:
        return Certificate(None, a, dl, n, 0, 0.0, None, 0.0, 0, int(candidates.size),
                           float(candidates[0]), float(p[0]))
    j = n_rejected - 1
    tau = float(candidates[j])
    return Certificate(tau, a, dl, n, int(x[j]), float(x[j]) / n, float(p[j]), float(np.mean(d >= tau)), n_rejected,
                       int(candidates.size), None if stop is None else float(candidates[stop]),
                       None if stop is None else float(p[stop]))
