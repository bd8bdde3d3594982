"""Benjamini–Hochberg false-discovery-rate control across cells (App. A.7.2, Tables 28–29)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from statsmodels.stats.multitest import multipletests

from pagestats.core import defaults
from pagestats.stats._results import _Result


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
