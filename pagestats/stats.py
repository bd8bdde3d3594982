"""Statistics of the PAGE paper at the NumPy level (NumPy, SciPy, statsmodels only).

Wilson intervals for rates (ρ, harm, p_open), Benjamini–Hochberg across cells, the
cluster bootstrap of the gating Δ (Table 28), the through-origin fit of the scaling
relation (Table 25), the per-input AUC (Mann–Whitney, §3) and the pre-registration of
prediction files by sha256 (Table 21). Results are small frozen dataclasses with
``to_dict()``; their fields are scalars for scalar input and arrays for array input.
Frame-level wrappers live in :mod:`pagestats.metrics`. The bootstrap
(:mod:`pagestats.bootstrap`) and pre-registration (:mod:`pagestats.prereg`) live in their
own modules and are re-exported here.

References
----------
PAGE paper: §3 (Eq. 1, AUC), §4 "Uncertainty", §4 "Pre-Registered 32K Test",
§5 (Eq. 4), App. A.6.4 (Table 25), App. A.7.2 (Tables 28–29).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as _sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from pagestats import defaults
from pagestats._results import _check_level, _Result, _scalar_or_array
from pagestats.bootstrap import BootstrapResult, bootstrap_pvalue, cluster_bootstrap
from pagestats.prereg import PreregistrationError, freeze_predictions, load_predictions

__all__ = [
    "Interval",
    "BHResult",
    "BootstrapResult",
    "FitResult",
    "AUCResult",
    "PreregistrationError",
    "wilson",
    "bh",
    "cluster_bootstrap",
    "bootstrap_pvalue",
    "through_origin_fit",
    "auc",
    "freeze_predictions",
    "load_predictions",
]

# --------------------------------------------------------------------------- Wilson


@dataclass(frozen=True)
class Interval(_Result):
    """A proportion ``k/n`` with its confidence interval.

    ``estimate``, ``low`` and ``high`` are NaN where ``n == 0`` (see :func:`wilson`);
    :attr:`defined` says where they are not.
    """

    estimate: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    k: int | np.ndarray
    n: int | np.ndarray
    confidence_level: float
    method: str = "wilson"

    @property
    def defined(self):
        """``n > 0``: where the estimate and interval are numbers rather than NaN."""
        return np.asarray(self.n) > 0


def _as_counts(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must be numeric counts, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    if np.any(arr != np.round(arr)):
        raise ValueError(f"{name} must be whole numbers")
    return arr.astype(np.int64)


def wilson(k, n, confidence_level: float = defaults.CONFIDENCE_LEVEL) -> Interval:
    """Wilson score interval for ``k`` successes in ``n`` trials, vectorised.

    Used for every rate of the paper: ρ (§3, Eq. 1; Table 1), harm rates (Table 27),
    the NIAH-MK3 showcase entries (Table 29).

    Parameters
    ----------
    k, n : int or array_like of int
        Successes and trials; broadcast against each other. ``0 <= k <= n``.
    confidence_level : float
        Two-sided level, 0.95 by default (App. A.7.2).

    Returns
    -------
    Interval
        Scalars for scalar input, arrays of the broadcast shape otherwise.

    Notes
    -----
    Computed by ``statsmodels.stats.proportion.proportion_confint(method="wilson")``
    (the method is named: statsmodels defaults to the normal interval). With ``z`` the
    ``1 − α/2`` normal quantile and ``p̂ = k/n`` the interval is
    ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``; ``0/n`` gives low 0 and
    ``n/n`` high 1. **n = 0** is not an error (an empty group in a grouped table is
    legitimate): estimate, low and high are NaN and :attr:`Interval.defined` is False.

    Examples
    --------
    >>> r = wilson(2, 526)   # pooled NIAH-MK3 recoveries (§4, Table 1)
    >>> round(r.estimate, 3), round(r.low, 3), round(r.high, 3)
    (0.004, 0.001, 0.014)
    """
    level = _check_level(confidence_level)
    k_arr, n_arr = np.broadcast_arrays(_as_counts(k, "k"), _as_counts(n, "n"))
    if np.any(n_arr < 0):
        raise ValueError("n must be >= 0")
    if np.any((k_arr < 0) | (k_arr > n_arr)):
        raise ValueError("k must satisfy 0 <= k <= n")
    empty = n_arr == 0
    safe_n = np.where(empty, 1, n_arr)
    low, high = proportion_confint(k_arr, safe_n, alpha=1.0 - level, method="wilson")
    est = k_arr / safe_n
    low, high, est = (np.where(empty, np.nan, np.asarray(v, dtype=np.float64)) for v in (low, high, est))
    # The closed form gives exactly 0 at k = 0 and 1 at k = n; statsmodels can be off by ~1e-17.
    low = np.where(k_arr == 0, np.where(empty, np.nan, 0.0), np.clip(low, 0.0, 1.0))
    high = np.where((k_arr == n_arr) & ~empty, 1.0, np.clip(high, 0.0, 1.0))
    return Interval(
        estimate=_scalar_or_array(est),
        low=_scalar_or_array(low),
        high=_scalar_or_array(high),
        k=_scalar_or_array(k_arr.copy()),
        n=_scalar_or_array(n_arr.copy()),
        confidence_level=level,
    )


# --------------------------------------------------------------------------- BH


@dataclass(frozen=True)
class BHResult(_Result):
    """Benjamini–Hochberg step-up: which hypotheses are rejected and the adjusted p-values."""

    rejected: np.ndarray
    adjusted: np.ndarray
    q: float
    n_tested: int
    method: str = "fdr_bh"


def bh(pvalues, q: float = defaults.FDR_Q) -> BHResult:
    """Benjamini–Hochberg false-discovery-rate control across cells (App. A.7.2, Table 28).

    Parameters
    ----------
    pvalues : array_like of float
        One p-value per hypothesis (any shape; results keep it).
    q : float
        FDR level, 0.05 by default.

    Returns
    -------
    BHResult
        ``rejected`` (bool) and ``adjusted`` (BH-adjusted p-values, capped at 1).

    Notes
    -----
    ``statsmodels.stats.multitest.multipletests(method="fdr_bh")`` (named explicitly: its
    default is Holm–Šidák). Sorting ``p_(1) ≤ … ≤ p_(m)``, the largest ``i`` with
    ``p_(i) ≤ i·q/m`` and all smaller ones are rejected; adjusted
    ``p̃_(i) = min_{j≥i} min(1, m·p_(j)/j)``.
    **NaN p-values** (e.g. a one-input cell, :func:`cluster_bootstrap`) are not tests: they
    are left out of the family (``m`` counts finite p-values only), their adjusted value is
    NaN and they are never rejected — as R's ``p.adjust`` does with ``NA``.
    """
    q = float(q)
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    p = np.asarray(pvalues, dtype=np.float64)
    finite = ~np.isnan(p)
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    rejected = np.zeros(p.shape, dtype=bool)
    adjusted = np.full(p.shape, np.nan)
    m = int(finite.sum())
    if m:
        rej, adj, _, _ = multipletests(p[finite], alpha=q, method="fdr_bh")
        rejected[finite] = rej
        adjusted[finite] = adj
    return BHResult(rejected=rejected, adjusted=adjusted, q=q, n_tested=m)


# --------------------------------------------------------------------------- through-origin fit


@dataclass(frozen=True)
class FitResult(_Result):
    """Least-squares line through the origin, ``y ≈ slope·x``."""

    slope: float
    se: float
    n: int
    r2: float
    method: str = "least squares through the origin"


def through_origin_fit(x, y) -> FitResult:
    """Through-origin least squares of ``y`` on ``x`` (§5 Eq. 4, App. A.6.4, Table 25, Fig. 9).

    Used for ρ on headroom ``1 − A_full`` over dilution-prone rows (slope ≈ 0.34 in the paper).

    Notes
    -----
    ``slope = Σxy / Σx²``; residuals ``e = y − slope·x``; ``se = sqrt(Σe² / (n − 1) / Σx²)``
    (one parameter, so ``n − 1`` degrees of freedom; NaN when ``n = 1``); ``r2`` is the
    *uncentred* coefficient of determination ``1 − Σe²/Σy²`` (the right one for a model
    without intercept; NaN when every ``y`` is 0).

    Raises
    ------
    ValueError
        Different lengths, no points, non-finite values, or every ``x`` equal to 0.
    """
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x and y differ in length ({xa.size} vs {ya.size})")
    if xa.size == 0:
        raise ValueError("through_origin_fit: no points")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise ValueError("through_origin_fit: x and y must be finite")
    sxx = float(xa @ xa)
    if sxx == 0.0:
        raise ValueError("through_origin_fit: every x is 0, the slope is undefined")
    slope = float(xa @ ya) / sxx
    resid = ya - slope * xa
    sse = float(resid @ resid)
    n = int(xa.size)
    se = float(np.sqrt(sse / (n - 1) / sxx)) if n > 1 else float("nan")
    syy = float(ya @ ya)
    r2 = 1.0 - sse / syy if syy > 0 else float("nan")
    return FitResult(slope=slope, se=se, n=n, r2=r2)


# --------------------------------------------------------------------------- AUC


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
    u = _sps.mannwhitneyu(dil, cap, alternative="two-sided").statistic
    est = float(u) / (n_cap * n_dil)
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
    )
