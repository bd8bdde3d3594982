"""Fits through the origin for the scaling slope ρ ≈ p_recov·(1 − A_full) (§5 Eq. 4, App. A.6.4,
Table 25, Fig. 9): the binomial GLM the report uses, and plain least squares."""

from __future__ import annotations

from dataclasses import dataclass

import contextlib
import warnings

import numpy as np
from statsmodels.tools.sm_exceptions import DomainWarning

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
    sxx = float(np.einsum("i,i->", xa, xa))
    if sxx == 0.0:
        raise ValueError("through_origin_fit: every x is 0, the slope is undefined")
    slope = float(np.einsum("i,i->", xa, ya)) / sxx
    resid = ya - slope * xa
    sse = float(np.einsum("i,i->", resid, resid))
    n = int(xa.size)
    se = float(np.sqrt(sse / (n - 1) / sxx)) if n > 1 else float("nan")
    syy = float(np.einsum("i,i->", ya, ya))
    r2 = 1.0 - sse / syy if syy > 0 else float("nan")
    return FitResult(slope=slope, se=se, n=n, r2=r2)


@dataclass(frozen=True)
class BinomialFitResult(_Result):
    """Binomial GLM with an identity link through the origin, ``k_i ~ Binomial(n_i, slope·x_i)``."""

    slope: float
    se: float
    n: int
    n_excluded: int
    deviance: float
    method: str = "binomial GLM, identity link, through the origin (statsmodels)"


def binomial_origin_fit(x, k, n, *, n_excluded: int = 0) -> BinomialFitResult:
    """Maximum-likelihood slope of ``k_i/n_i`` on ``x_i`` through the origin under binomial noise.

    The scaling relation (§5 Eq. 4) is a proportion ρ = k/n per row with n from a dozen to a
    few hundred inputs, so rows are weighted by their binomial information rather than
    equally: ``statsmodels.GLM(endog=[k, n − k], exog=x, family=Binomial(link=Identity()))``
    without a constant (iteratively reweighted least squares with weights
    n_i / (μ_i(1 − μ_i)), μ_i = slope·x_i). ``se`` is the model-based standard error
    (scale 1) and ``deviance`` the residual deviance.

    Parameters
    ----------
    x : array_like
        The regressor (headroom 1 − A_full); every value must be > 0.
    k, n : array_like of int
        Successes (recovered inputs) and trials (inputs) per row.
    n_excluded : int
        Rows the caller left out (e.g. zero headroom), recorded in the result.

    Raises
    ------
    ValueError
        Mismatched lengths, no rows, x ≤ 0, k outside [0, n], or no success at all (the
        slope is then 0 on the boundary and its standard error undefined).
    """
    import statsmodels.api as sm  # 0.5 s CPU, paid only by the scaling fit (ARCHITECTURE.md)

    xa = np.asarray(x, dtype=np.float64).ravel()
    ka = np.asarray(k, dtype=np.float64).ravel()
    na = np.asarray(n, dtype=np.float64).ravel()
    if not xa.shape == ka.shape == na.shape:
        raise ValueError(f"x, k and n differ in length ({xa.size}, {ka.size}, {na.size})")
    if xa.size == 0:
        raise ValueError("binomial_origin_fit: no rows")
    if not np.all(np.isfinite(xa)) or np.any(xa <= 0):
        raise ValueError("binomial_origin_fit: x must be finite and > 0 (leave zero-headroom rows out)")
    if np.any(ka < 0) or np.any(ka > na) or np.any(na < 1):
        raise ValueError("binomial_origin_fit: need 0 ≤ k ≤ n and n ≥ 1")
    if ka.sum() == 0:
        raise ValueError("binomial_origin_fit: no row has a success; the slope is 0 and its SE undefined")
    family = sm.families.Binomial(link=sm.families.links.Identity())
    # one row: statsmodels' IRLS step (a WLS fit) divides the residual sum of squares by its zero residual
    # degrees of freedom for a scale that the binomial family does not use (it is fixed at 1), so NumPy's
    # divide-by-zero warning carries no information (slope and SE are the closed form's, k/(n·x) and
    # √(p(1−p)/n)/x); every report of one context printed it
    quiet = np.errstate(divide="ignore", invalid="ignore") if xa.size == 1 else contextlib.nullcontext()
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore", DomainWarning)  # identity link: μ = slope·x stays in (0, 1) here
        res = sm.GLM(np.column_stack([ka, na - ka]), xa[:, None], family=family).fit(
            start_params=np.array([ka.sum() / (na * xa).sum()]))
    slope = float(res.params[0])
    if np.any(slope * xa >= 1.0):
        raise ValueError("binomial_origin_fit: the fitted proportion reaches 1 on some row")
    return BinomialFitResult(slope=slope, se=float(res.bse[0]), n=int(xa.size), n_excluded=int(n_excluded),
                             deviance=float(res.deviance))
