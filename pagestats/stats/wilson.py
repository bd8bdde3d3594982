"""Wilson score intervals for proportions: ρ, harm and p_open (§4 "Uncertainty", Tables 1, 27)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from statsmodels.stats.proportion import proportion_confint

from pagestats.core import defaults
from pagestats.stats._results import _check_level, _Result, _scalar_or_array


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
