"""Cluster bootstrap of the gating Δ over inputs (App. A.7.2, Table 28), NumPy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagestats.core import defaults
from pagestats.stats._results import _check_level, _Result

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


#: ``draw="auto"`` uses multinomial counts when a cell has at most ``max(3, n // 40)``
#: distinct per-input means. The constant is the measured crossover of the two draws
#: (``bench/bootstrap.py`` writes it to ``bench/results/bootstrap.json``, key
#: ``crossover``): a multinomial count costs about 25–40 index draws.
COUNTS_CROSSOVER = 40
DRAWS = ("auto", "indices", "counts")


def _use_counts(n_inputs: int, n_distinct: int, draw: str) -> bool:
    if draw == "auto":
        return n_distinct <= max(3, n_inputs // COUNTS_CROSSOVER)
    return draw == "counts"


def _index_replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int) -> np.ndarray:
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


def _shared_index_replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int) -> np.ndarray:
    """Δ* for cells sharing their inputs: one resample of input rows per replicate for all cells.

    ``means`` is (n_inputs, n_cells); returns (n_cells, n_boot). The same index chunks as
    :func:`_index_replicates` (``rows = chunk_size // n``) gather whole rows of ``means``.
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


def weighted_sums(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``weights @ values`` summed in one fixed order, whatever the BLAS and its thread count.

    A BLAS product splits its sums over threads, so the last bits of a replicate would depend on
    ``OMP_NUM_THREADS`` and a rerun on another machine could write another CSV. ``numpy.einsum``
    (without ``optimize``) never calls BLAS: each sum runs in one thread, in index order.

    Parameters
    ----------
    weights : numpy.ndarray, shape (R, n)
        Resample counts (or any weights), one row per replicate.
    values : numpy.ndarray, shape (n,) or (n, m)

    Returns
    -------
    numpy.ndarray, shape (R,) or (R, m), float64
    """
    w = np.asarray(weights, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    return np.einsum("rn,n->r", w, v) if v.ndim == 1 else np.einsum("rn,nm->rm", w, v)


def resample_counts(counts: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int = 1 << 18):
    """The cluster bootstrap's resamples as counts, ``chunk_size`` draws at a time.

    ``counts[i]`` inputs carry row ``i`` of a statistic's data (1 each when the rows are the
    inputs themselves; the multiplicities of the distinct rows otherwise). Resampling the
    ``n = counts.sum()`` inputs with replacement and counting how many of the resample carry each
    row gives ``C ~ Multinomial(n, counts / n)``. Yields the count matrices, ``(k, len(counts))``
    with ``k = max(1, chunk_size // len(counts))`` replicates each (fewer in the last), ``n_boot``
    rows in all: the same rows, in the same order, as one ``rng.multinomial(n, counts / n,
    size=n_boot)`` call, without holding ``n_boot × len(counts)`` counts at once.
    """
    counts = np.asarray(counts)
    n = int(counts.sum())
    p = counts / n
    rows = min(n_boot, max(1, chunk_size // len(counts)))
    for start in range(0, n_boot, rows):
        yield rng.multinomial(n, p, size=min(rows, n_boot - start))


def _count_replicates(
    values: np.ndarray, counts: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int
) -> np.ndarray:
    """Δ* from multinomial counts over the distinct per-input means (rows of ``values``).

    ``values`` is (n_distinct, n_cells) and ``counts`` how many inputs carry each row.
    Resampling ``n`` inputs with replacement and then grouping them by their row of means
    gives counts ``C ~ Multinomial(n, counts / n)``, and Δ* = ``C @ values / n``: the
    same distribution as :func:`_index_replicates`, with ``n_distinct`` binomial draws
    per replicate instead of ``n`` index draws. Returns (n_cells, n_boot).
    """
    n = int(counts.sum())
    out = np.empty((values.shape[1], n_boot))
    start = 0
    for chunk in resample_counts(counts, n_boot, rng, chunk_size):
        out[:, start : start + len(chunk)] = weighted_sums(chunk, values).T / n
        start += len(chunk)
    return out


def _replicates(means: np.ndarray, n_boot: int, rng: np.random.Generator, chunk_size: int, draw: str) -> np.ndarray:
    """Δ* for one cell (``means`` 1-D) or cells sharing inputs (2-D): (n_cells, n_boot)."""
    if means.ndim == 1:  # 1-D unique is a plain sort; axis=0 would compare rows as bytes
        values, counts = np.unique(means, return_counts=True)
        values = values[:, None]
    else:
        values, counts = np.unique(means, axis=0, return_counts=True)
    if _use_counts(means.shape[0], len(counts), draw):
        return _count_replicates(values, counts, n_boot, rng, chunk_size)
    if means.ndim == 1:
        return _index_replicates(means, n_boot, rng, chunk_size)[None, :]
    return _shared_index_replicates(means, n_boot, rng, chunk_size)


def cluster_bootstrap(
    diffs,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    shared_inputs: bool = False,
    chunk_size: int = 1 << 18,
    draw: str = "auto",
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
        Random draws made at once (bounds memory: about ``18·chunk_size`` bytes; the
        default 2¹⁸ keeps a chunk in cache).
    draw : {"auto", "indices", "counts"}
        How a replicate's resample is drawn; both give the same bootstrap distribution
        (see Notes). ``"indices"``: ``n`` input indices per replicate. ``"counts"``: one
        multinomial count vector over the cell's distinct per-input means (rows of means
        with ``shared_inputs``). ``"auto"`` (default) takes ``"counts"`` when there are
        at most ``max(3, n // COUNTS_CROSSOVER)`` distinct values, where it is faster —
        the usual case for binary scores, whose per-input means over ``m`` budgets take
        at most ``2m + 1`` values.
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
    mean over the resampled inputs of the per-input means. Two draws give it:

    - ``"indices"``: one replicate is a gather and a mean. Replicates are drawn in row
      chunks of an index matrix ``rng.integers(0, n, size=(rows, n), dtype=uint16)``
      (int64 above 65,535 inputs), ``rows = max(1, chunk_size // n)``. With
      ``shared_inputs=True`` the same index chunks are drawn once for all cells and
      gather whole rows of the (n_inputs, n_cells) matrix of per-input means.
    - ``"counts"``: Δ* depends on the resample only through how many times each
      *distinct* per-input mean ``v_j`` (held by ``m_j`` inputs) is drawn, and those
      counts are ``C ~ Multinomial(n, m / n)`` — the same law as counting ``n`` uniform
      index draws. So ``Δ* = Σ_j C_j v_j / n`` with ``C`` from ``rng.multinomial`` in
      chunks of ``max(1, chunk_size // n_distinct)`` replicates (``numpy.unique`` order
      of the values; rows of means with ``shared_inputs``). This is exact, not an
      approximation; it only changes which random numbers are drawn.

    Cells are processed in order, so the random stream is fixed by ``rng``, the cell
    order, ``chunk_size`` and the draw each cell takes (which, under ``"auto"``, is fixed
    by the data).

    Interval: ``numpy.quantile`` (linear) of Δ* at ``α/2`` and ``1 − α/2``. p-value:
    :func:`bootstrap_pvalue` of Δ* against 0. Degenerate cells: **one input**, or **no
    variation** (every input's mean difference equal, e.g. Δ ≡ 0 where the gate opens on
    every input) → the resampling distribution is a point mass and carries no information,
    so the interval is ``[Δ, Δ]`` and the p-value NaN: such a cell is no test and is left
    out of the :func:`bh` family, consistently for both cases.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (np.random.default_rng(seed))")
    n_boot = int(n_boot)
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    if int(chunk_size) < 1:
        raise ValueError("chunk_size must be >= 1")
    if draw not in DRAWS:
        raise ValueError(f"draw must be one of {DRAWS}, got {draw!r}")
    level = _check_level(confidence_level)
    cells, single = _as_cells(diffs)
    alpha = 1.0 - level
    if shared_inputs:
        sizes = {c.shape[0] for c in cells}
        if len(sizes) != 1:
            raise ValueError(f"shared_inputs=True needs the same n_inputs in every cell, got {sorted(sizes)}")
        shared = _replicates(np.stack([c.mean(axis=1) for c in cells], axis=1), n_boot, rng, int(chunk_size), draw)
    est, low, high, pval, reps_all = [], [], [], [], []
    for i, c in enumerate(cells):
        reps = shared[i] if shared_inputs else _replicates(c.mean(axis=1), n_boot, rng, int(chunk_size), draw)[0]
        lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
        est.append(c.mean())
        low.append(lo)
        high.append(hi)
        means = c.mean(axis=1)
        pval.append(np.nan if np.ptp(means) == 0 else float(bootstrap_pvalue(reps)))  # one input, or no variation
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
