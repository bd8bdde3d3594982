"""Statistics of the PAGE paper at the NumPy level (NumPy, SciPy, statsmodels only).

Wilson intervals for rates (ρ, harm, p_open), Benjamini–Hochberg across cells, the
cluster bootstrap of the gating Δ (Table 28), the through-origin fit of the scaling
relation (Table 25), the per-input AUC (Mann–Whitney, §3) and the pre-registration of
prediction files by sha256 (Table 21). Results are small frozen dataclasses with
``to_dict()``; their fields are scalars for scalar input and arrays for array input.
Frame-level wrappers live in :mod:`pagestats.metrics`.

References
----------
PAGE paper: §3 (Eq. 1, AUC), §4 "Uncertainty", §4 "Pre-Registered 32K Test",
§5 (Eq. 4), App. A.6.4 (Table 25), App. A.7.2 (Tables 28–29).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from scipy import stats as _sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from pagestats import defaults

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


def _plain(value):
    """A field value as plain Python (0-d → scalar, arrays → lists) for ``to_dict``."""
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class _Result:
    def to_dict(self) -> dict:
        """Fields as plain Python values (arrays become lists); ``None`` fields are left out."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}


def _check_level(confidence_level: float) -> float:
    level = float(confidence_level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")
    return level


def _scalar_or_array(x: np.ndarray):
    return x.item() if x.ndim == 0 else x


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


# --------------------------------------------------------------------------- cluster bootstrap


@dataclass(frozen=True)
class BootstrapResult(_Result):
    """Cluster-bootstrap estimate of Δ with its percentile interval and p-value.

    Scalars for one cell, arrays (one entry per cell) for several. ``replicates`` is only
    kept when asked for (shape ``(n_boot,)`` or ``(n_cells, n_boot)``).
    """

    estimate: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    p_value: float | np.ndarray
    n_inputs: int | np.ndarray
    n_budgets: int | np.ndarray
    n_boot: int
    confidence_level: float
    method: str = "cluster bootstrap (inputs), percentile"
    replicates: np.ndarray | None = None


def bootstrap_pvalue(replicates, null: float = 0.0) -> np.ndarray:
    """Two-sided bootstrap p-value of ``H0: Δ = null`` from replicates (last axis).

    ``p = min(1, 2·min(1 + #{Δ* ≤ null}, 1 + #{Δ* ≥ null}) / (B + 1))``.

    Notes
    -----
    This is the p-value that inverts the percentile interval: the smallest α at which
    the equal-tailed ``1 − α`` percentile interval excludes ``null``, so "the 95%
    interval excludes 0" and "p < 0.05" agree. The ``+1`` in numerator and denominator
    counts the observed sample as one more draw (Davison & Hinkley 1997, §4.2), so the
    p-value is never 0 and its floor is ``2/(B+1)`` (≈ 2×10⁻⁴ at B = 10,000, matching
    Table 28's "p ≤ 5×10⁻⁴"). A cell with no variance (every Δ* equal to ``null``) gets
    ``p = 1``.
    """
    reps = np.asarray(replicates, dtype=np.float64)
    b = reps.shape[-1]
    below = 1 + np.sum(reps <= null, axis=-1)
    above = 1 + np.sum(reps >= null, axis=-1)
    return np.minimum(1.0, 2.0 * np.minimum(below, above) / (b + 1))


def _as_cells(diffs) -> tuple[list[np.ndarray], bool]:
    """Normalise ``diffs`` to a list of (n_inputs, n_budgets) float arrays; flag one cell."""
    if isinstance(diffs, (list, tuple)):
        cells, single = [np.asarray(d, dtype=np.float64) for d in diffs], False
        if not cells:
            raise ValueError("diffs: no cells given")
    else:
        arr = np.asarray(diffs, dtype=np.float64)
        if arr.ndim == 3:
            cells, single = list(arr), False
        elif arr.ndim in (1, 2):
            cells, single = [arr], True
        else:
            raise ValueError(f"diffs must be (n_inputs, n_budgets), a list of those, or 3-D; got shape {arr.shape}")
    out = []
    for i, c in enumerate(cells):
        c = c[:, None] if c.ndim == 1 else c
        if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
            raise ValueError(f"cell {i}: need a non-empty (n_inputs, n_budgets) array, got shape {c.shape}")
        if not np.all(np.isfinite(c)):
            raise ValueError(f"cell {i}: differences must be finite (no NaN/inf)")
        out.append(c)
    return out, single


def _replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int) -> np.ndarray:
    """Δ* for one cell: mean of per-input means over inputs resampled with replacement."""
    n = means.shape[0]
    dtype = np.uint16 if n <= np.iinfo(np.uint16).max else np.int64
    rows = min(n_boot, max(1, chunk_size // n))
    out = np.empty(n_boot)
    # Buffers reused across chunks: fresh multi-MB temporaries per chunk cost page faults
    # that can triple the run time. intp indices + take(mode="clip") skip fancy indexing's
    # per-element bounds checks; the indices are in range by construction.
    index_buf = np.empty((rows, n), dtype=np.intp)
    value_buf = np.empty((rows, n))
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        np.copyto(index_buf[:k], rng.integers(0, n, size=(k, n), dtype=dtype), casting="unsafe")
        means.take(index_buf[:k], mode="clip", out=value_buf[:k])
        out[start : start + k] = value_buf[:k].mean(axis=1)
    return out


def _shared_replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int) -> np.ndarray:
    """Δ* for cells sharing their inputs: one resample of input rows per replicate for all cells.

    ``means`` is (n_inputs, n_cells); returns (n_cells, n_boot). The same index chunks as
    :func:`_replicates` (``rows = chunk_size // n``) gather whole rows of ``means``.
    """
    n, n_cells = means.shape
    dtype = np.uint16 if n <= np.iinfo(np.uint16).max else np.int64
    rows = min(n_boot, max(1, chunk_size // n))
    out = np.empty((n_cells, n_boot))
    index_buf = np.empty((rows, n), dtype=np.intp)
    value_buf = np.empty((rows, n, n_cells))
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        np.copyto(index_buf[:k], rng.integers(0, n, size=(k, n), dtype=dtype), casting="unsafe")
        means.take(index_buf[:k], axis=0, mode="clip", out=value_buf[:k])
        out[:, start : start + k] = value_buf[:k].mean(axis=1).T
    return out


def cluster_bootstrap(
    diffs,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    shared_inputs: bool = False,
    chunk_size: int = 1 << 18,
    return_replicates: bool = False,
) -> BootstrapResult:
    """Cluster bootstrap over inputs of the gating Δ (App. A.7.2, Table 28).

    Parameters
    ----------
    diffs : array_like, shape (n_inputs, n_budgets); or a list of such; or 3-D
        Paired differences ``A_gated(b, x) − A_plain(b, x)`` for budgets ``b < 1``, one
        row per input (the cluster), one column per budget. A list (or a 3-D array)
        holds several cells, which may differ in ``n_inputs``/``n_budgets``. A 1-D array
        is one budget.
    rng : numpy.random.Generator
        Source of the resampling indices (required; never global).
    n_boot : int
        Replicates, 10,000 by default.
    confidence_level : float
        Level of the equal-tailed percentile interval (0.95 → 2.5–97.5 percentiles).
    shared_inputs : bool
        False (default): every cell is resampled independently, as Table 28 describes.
        True: the cells hold the *same* inputs in the same row order (e.g. the four
        evictors of one (model, context), which the paper runs on one input set); each
        replicate resamples the input rows once and applies the resample to every cell.
        Each cell's bootstrap distribution is the same as with independent resampling;
        the joint one keeps the between-cell correlation (needed for contrasts between
        cells). All cells must have the same ``n_inputs``.
    chunk_size : int
        Index-matrix elements drawn at once (bounds memory: about ``18·chunk_size`` bytes;
        the default 2¹⁸ keeps a chunk in cache).
    return_replicates : bool
        Keep the Δ* replicates in the result.

    Returns
    -------
    BootstrapResult

    Notes
    -----
    Δ of a cell is the mean over inputs and budgets of the differences. A replicate
    resamples the ``n`` inputs with replacement, each carrying its whole row of
    per-budget differences (the pairing and the within-input correlation across budgets
    are kept), and recomputes Δ. With every input carrying the same budgets, Δ* is the
    mean over the resampled inputs of the per-input means, so one replicate is a gather
    and a mean: replicates are drawn in row chunks of an index matrix
    ``rng.integers(0, n, size=(rows, n), dtype=uint16)`` (int64 above 65,535 inputs),
    ``rows = max(1, chunk_size // n)``; cells are processed in order, so the random
    stream is fixed by ``rng``, the cell order and ``chunk_size``. With
    ``shared_inputs=True`` the same index chunks are drawn once for all cells and
    gather whole rows of the (n_inputs, n_cells) matrix of per-input means.

    Interval: ``numpy.quantile`` (linear) of Δ* at ``α/2`` and ``1 − α/2``. p-value:
    :func:`bootstrap_pvalue` of Δ* against 0. Degenerate cells: all differences equal →
    every Δ* equals Δ, the interval is ``[Δ, Δ]`` (``[0, 0]`` and ``p = 1`` when they
    are 0); **one input** → the resampling distribution is a point mass and carries no
    information, so the interval is ``[Δ, Δ]`` and the p-value NaN (left out by
    :func:`bh`).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (np.random.default_rng(seed))")
    n_boot = int(n_boot)
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    if int(chunk_size) < 1:
        raise ValueError("chunk_size must be >= 1")
    level = _check_level(confidence_level)
    cells, single = _as_cells(diffs)
    alpha = 1.0 - level
    if shared_inputs:
        sizes = {c.shape[0] for c in cells}
        if len(sizes) != 1:
            raise ValueError(f"shared_inputs=True needs the same n_inputs in every cell, got {sorted(sizes)}")
        shared = _shared_replicates(np.stack([c.mean(axis=1) for c in cells], axis=1), n_boot, rng, int(chunk_size))
    est, low, high, pval, reps_all = [], [], [], [], []
    for i, c in enumerate(cells):
        reps = shared[i] if shared_inputs else _replicates(c.mean(axis=1), n_boot, rng, int(chunk_size))
        lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
        est.append(c.mean())
        low.append(lo)
        high.append(hi)
        pval.append(np.nan if c.shape[0] == 1 else float(bootstrap_pvalue(reps)))
        if return_replicates:
            reps_all.append(reps)

    def pack(values, dtype=np.float64):
        arr = np.asarray(values, dtype=dtype)
        return arr[0].item() if single else arr

    return BootstrapResult(
        estimate=pack(est),
        low=pack(low),
        high=pack(high),
        p_value=pack(pval),
        n_inputs=pack([c.shape[0] for c in cells], np.int64),
        n_budgets=pack([c.shape[1] for c in cells], np.int64),
        n_boot=n_boot,
        confidence_level=level,
        replicates=(reps_all[0] if single else np.stack(reps_all)) if return_replicates else None,
    )


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


# --------------------------------------------------------------------------- pre-registration


class PreregistrationError(ValueError):
    """A frozen prediction file does not match its recorded sha256."""


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FORMATS = (".csv", ".parquet")


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"prediction file must end in .csv or .parquet, got {path.name!r}")
    return suffix


def freeze_predictions(frame, path, *, overwrite: bool = False) -> str:
    """Freeze a pre-registered prediction table (Table 21; §4 "Pre-Registered 32K Test").

    Writes ``frame`` (a polars DataFrame) to ``path`` (``.csv`` or ``.parquet``)
    atomically, then records its sha256 in ``path + ".sha256"`` (``sha256sum`` format,
    ``"<hex>  <name>"``) and returns it. The hash is of the file's bytes, so it is what
    :func:`load_predictions` checks. An existing file is never replaced unless
    ``overwrite=True`` — a pre-registration that can be silently redone is not one.
    Record the returned hash somewhere the measurement cannot touch (a commit, a report)
    before the measurement is run.
    """
    path = Path(path)
    fmt = _format(path)
    if not hasattr(frame, "write_csv"):
        raise TypeError("frame must be a polars DataFrame")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; predictions are frozen once (overwrite=True to replace)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    if fmt == ".csv":
        frame.write_csv(tmp)
    else:
        frame.write_parquet(tmp)
    os.replace(tmp, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return digest


def load_predictions(path, sha256: str):
    """Load a frozen prediction table after checking its sha256 (Table 21).

    The file is read once; its bytes are hashed and compared with ``sha256`` *before*
    they are parsed, so a mismatching file is never used. Call this before any
    measurement of the predicted quantity is loaded.

    Raises
    ------
    PreregistrationError
        The file's sha256 differs from ``sha256``.
    """
    import io

    import polars as pl

    path = Path(path)
    fmt = _format(path)
    expected = str(sha256).strip().lower()
    if not _HEX64.match(expected):
        raise ValueError("sha256 must be 64 hexadecimal characters")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise PreregistrationError(f"{path}: sha256 {actual} does not match the frozen {expected}")
    return pl.read_csv(io.BytesIO(data)) if fmt == ".csv" else pl.read_parquet(io.BytesIO(data))
