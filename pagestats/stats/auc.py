"""Per-input AUC of a gate signal with a DeLong interval (§3, App. A.3.2, Tables 5–6)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as _sps

from pagestats.core import defaults
from pagestats.stats._results import _check_level, _Result


@dataclass(frozen=True)
class AUCResult(_Result):
    """Per-input AUC: Pr[score(dilution-prone) > score(capacity-bound)] + ½·Pr[tie]."""

    estimate: float
    low: float
    high: float
    se: float
    n_capacity: int
    n_dilution: int
    confidence_level: float
    p_value: float
    method: str = "Mann-Whitney U/(n1·n2); DeLong interval"


def auc(scores, capacity_bound, confidence_level: float = defaults.CONFIDENCE_LEVEL) -> AUCResult:
    """Per-input separability of capacity-bound vs dilution-prone inputs (§3, App. A.3.2, Tables 5–6).

    Parameters
    ----------
    scores : array_like of float
        Per-input statistic, e.g. the drop D (Eq. 3).
    capacity_bound : array_like of bool
        True for capacity-bound inputs, False for dilution-prone ones.

    Returns
    -------
    AUCResult

    Notes
    -----
    Orientation: capacity-bound inputs should have the LOWER D (the gate closes when
    ``D < τ``), so ``AUC = Pr[D(x_dil) > D(x_cap)] + ½·Pr[D(x_dil) = D(x_cap)]`` over
    independent pairs; 1 = perfect, 0.5 = chance, below 0.5 = inverted (the paper's
    "oriented per signal" for other statistics is the caller's choice of sign).
    Computed as ``scipy.stats.mannwhitneyu(dil, cap).statistic / (n_dil·n_cap)`` (U
    counts ties as ½). Interval: DeLong's variance from the structural components
    ``V10_i = (R_i − R_i^dil)/n_cap`` and ``V01_j = 1 − (R_j − R_j^cap)/n_dil`` (midranks
    in the pooled sample and within the class), ``se² = s²(V10)/n_dil + s²(V01)/n_cap``,
    normal interval clipped to [0, 1]; degenerate (zero width) at AUC 0 or 1.
    ``p_value``: the two-sided Mann–Whitney test of AUC = 0.5 on the same U (asymptotic with
    tie correction when the samples are large, exact otherwise); two-sided because the
    orientation of a signal is chosen after looking (Table 5).
    """
    level = _check_level(confidence_level)
    s = np.asarray(scores, dtype=np.float64).ravel()
    lab = np.asarray(capacity_bound).ravel()
    if lab.dtype != bool:
        raise TypeError("capacity_bound must be boolean")
    if s.shape != lab.shape:
        raise ValueError("scores and capacity_bound differ in length")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    cap, dil = s[lab], s[~lab]
    n_cap, n_dil = cap.size, dil.size
    if n_cap == 0 or n_dil == 0:
        raise ValueError(f"auc needs both classes (capacity-bound: {n_cap}, dilution-prone: {n_dil})")
    test = _sps.mannwhitneyu(dil, cap, alternative="two-sided")
    est = float(test.statistic) / (n_cap * n_dil)
    ranks = _sps.rankdata(np.concatenate([dil, cap]))
    v10 = (ranks[:n_dil] - _sps.rankdata(dil)) / n_cap
    v01 = 1.0 - (ranks[n_dil:] - _sps.rankdata(cap)) / n_dil
    var = (np.var(v10, ddof=1) / n_dil if n_dil > 1 else 0.0) + (np.var(v01, ddof=1) / n_cap if n_cap > 1 else 0.0)
    se = float(np.sqrt(var))
    z = _sps.norm.ppf(0.5 + level / 2)
    return AUCResult(
        estimate=est,
        low=float(max(0.0, est - z * se)),
        high=float(min(1.0, est + z * se)),
        se=se,
        n_capacity=int(n_cap),
        n_dilution=int(n_dil),
        confidence_level=level,
        p_value=float(test.pvalue),
    )
