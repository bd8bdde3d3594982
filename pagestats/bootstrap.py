"""Cluster bootstrap of the gating Δ over inputs (App. A.7.2, Table 28), NumPy only.

Re-exported by :mod:`pagestats.stats`; the frame-level wrapper is
:func:`pagestats.gating.delta_bootstrap`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagestats import defaults
from pagestats._results import _check_level, _Result

__all__ = ["BootstrapResult", "bootstrap_pvalue", "cluster_bootstrap"]


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


# Inputs at most this many use the 16-bit multiply-shift draw (rejection ≤ 2^12/2^16 = 6.25%).
_LEMIRE16_MAX_N = 1 << 12


def _draw_indices(rng: np.random.Generator, n: int, k: int, out: np.ndarray, work: np.ndarray,
                  low: np.ndarray) -> np.ndarray:
    """Fill ``out[:k]`` (uint16, shape (rows, n)) with i.i.d. uniform indices in ``[0, n)``; return it.

    Lemire's multiply-shift on 16-bit words (Lemire 2019, "Fast random integer generation in
    an interval", ACM TOMACS 29(1)), vectorised: ``k·n`` words ``u`` are the raw 64-bit
    outputs of ``rng``'s bit generator (``ceil(k·n/4)`` of them) read as little-endian
    16-bit words in order; ``index = (u·n) >> 16``, accepted when ``(u·n) mod 2¹⁶ ≥
    2¹⁶ mod n`` (every index then has exactly ``floor(2¹⁶/n)`` accepted words, so accepted
    draws are exactly uniform). Rejected positions (row-major order) are redrawn with
    ``rng.integers(0, n, size=#rejected)``, so the result is exactly i.i.d. uniform: a
    multinomial resample, no approximation. ``work`` (uint32) and ``low`` (uint16) are
    buffers of ``out``'s shape.
    """
    m = k * n
    idx, prod, low = out[:k], work[:k], low[:k]
    words = rng.bit_generator.random_raw((m + 3) // 4).astype("<u8", copy=False).view("<u2")[:m].reshape(k, n)
    np.multiply(words, np.uint32(n), out=prod)
    np.right_shift(prod, 16, out=idx, casting="unsafe")
    threshold = (1 << 16) % n
    if threshold:
        np.multiply(words, np.uint16(n), out=low)  # wraps: (u·n) mod 2¹⁶
        rejected = np.flatnonzero(low < threshold)
        if rejected.size:
            idx.reshape(-1)[rejected] = rng.integers(0, n, size=rejected.size, dtype=np.uint16)
    return idx


def _replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int) -> np.ndarray:
    """Δ* for cells sharing one resample per replicate: (n_cells, n_boot) from (n_cells, n_inputs) means.

    One cell (``n_cells = 1``) is the independent case. Per chunk of ``rows`` replicates one
    index matrix is drawn (:func:`_draw_indices`, or ``rng.integers`` above
    ``_LEMIRE16_MAX_N`` inputs) and every cell gathers its per-input means with it; the row
    means are a matrix–vector product with ``1/n``.
    """
    n_cells, n = means.shape
    rows = min(n_boot, max(1, chunk_size // n))
    out = np.empty((n_cells, n_boot))
    # Buffers reused across chunks: fresh multi-MB temporaries per chunk cost page faults.
    # take(mode="clip") with an out buffer gathers with narrow indices without converting
    # them to intp or bounds-checking them (they are in range by construction).
    value_buf = np.empty((rows, n))
    weights = np.full(n, 1.0 / n)
    small = n <= _LEMIRE16_MAX_N
    if small:
        bufs = [np.empty((rows, n), dtype=t) for t in (np.uint16, np.uint32, np.uint16)]
    wide = np.uint16 if n <= 1 << 16 else np.int32 if n <= 1 << 31 else np.int64
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        if small:
            idx = _draw_indices(rng, n, k, *bufs)
        else:
            idx = rng.integers(0, n, size=(k, n), dtype=wide)
        for c in range(n_cells):
            means[c].take(idx, mode="clip", out=value_buf[:k])
            np.matmul(value_buf[:k], weights, out=out[c, start : start + k])
    return out


def cluster_bootstrap(
    diffs,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    shared_inputs: bool = False,
    chunk_size: int = 1 << 16,
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
        the default 2¹⁶ keeps a chunk's buffers in a 1 MiB L2 cache).
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
    and a mean (a matrix–vector product with ``1/n``; it agrees with the mean of the
    resampled raw rows to rounding, tested to 1e-12 relative). Replicates come in row chunks of an index matrix, ``rows = max(1,
    chunk_size // n)`` replicates per chunk. Up to 4,096 inputs the indices are exact
    uniform draws by Lemire's multiply-shift on 16-bit words of ``rng``'s raw output with
    rejected words redrawn (:func:`_draw_indices`; every input has probability exactly
    ``1/n``, so the resample is the multinomial one); above that,
    ``rng.integers(0, n, size=(rows, n))`` in the narrowest unsigned/int dtype. Cells are
    processed in order, so the random stream is fixed by ``rng``, the cell order and
    ``chunk_size``. With ``shared_inputs=True`` the same index chunks are drawn once and
    gather every cell's per-input means.

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
        shared = _replicates(np.stack([c.mean(axis=1) for c in cells]), n_boot, rng, int(chunk_size))
    est, low, high, pval, reps_all = [], [], [], [], []
    for i, c in enumerate(cells):
        reps = shared[i] if shared_inputs else _replicates(c.mean(axis=1)[None], n_boot, rng, int(chunk_size))[0]
        delta = c.mean()
        if np.all(c.mean(axis=1) == c[0].mean()):  # no between-input variance: Δ* ≡ Δ, not Δ ± rounding
            reps = np.full(n_boot, delta)
        lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
        est.append(delta)
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
