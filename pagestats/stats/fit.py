"""Least squares through the origin: the scaling slope ρ ≈ p_recov·(1 − A_full) (§5 Eq. 4, App. A.6.4, Table 25, Fig. 9)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagestats.stats._results import _Result


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
