"""Δ at matched memory: the gated arm against plain eviction at the same kept KV (PAGE §4, Table 27 caption).

The paper's Δ compares the gated and the plain arm at the same *nominal* budget b. The gated arm keeps
the full cache where the gate is closed, so it holds more KV than plain eviction at that b, and the
paper itself says that Δ is "at matched nominal budget, not a compression win", and that "the
defensible headline is the harm reduction (Table 27) and the matched-cache frontier". This module
measures the second: per (model, context, evictor) cell and budget b < 1,

* the gated arm's mean kept KV ``k_g(b)`` (n_kept / n_tokens) and accuracy ``A_g(b)``;
* plain eviction's **frontier**: its points ``(k_p(b'), A_p(b'))`` over every logged budget b'
  (b' = 1 is the full cache), reduced to the Pareto points (every other point that keeps no more KV
  scores lower; of points within :data:`FRONTIER_TOL` in accuracy the one keeping least), joined by
  straight lines. A point on a segment is what plain eviction reaches by running
  the two budgets at its ends on complementary shares of the inputs, so it is attainable in
  expectation at that mean kept KV;
* ``A_p*(b) = frontier(k_g(b))`` and ``Δ_matched = mean over b < 1 of A_g(b) − A_p*(b)``.

``Δ_matched`` > 0 means the gate beats any plain budget (or mix of two) that keeps as much KV on
average. The interval is a cluster bootstrap over inputs (every mean, the frontier included, is
recomputed on each resample), and Benjamini–Hochberg runs across the cells of a call, as for Table 28.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from dataclasses import dataclass

import numpy as np
import polars as pl

from pagestats import stats
from pagestats.core import defaults, formulas
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, grouped, names, query
from pagestats.core.schema import INPUT_KEY

__all__ = ["MatchedCells", "frontier_accuracy", "matched_cells", "matched_memory"]

#: The resample is drawn over the distinct rows of a cell (an input's plain and gated scores and kept
#: fractions at every budget) when they are at most 1/8 of its inputs; otherwise over the inputs.
#: Both draws give the same bootstrap distribution; the first costs one binomial draw per distinct
#: row instead of per input, which is what lets a cell of 1M inputs (about 78,000 distinct rows on
#: the synthetic release) resample at all.
DISTINCT_ROWS_FACTOR = 8

#: The four per-budget quantities of a cell's matrix, side by side (:func:`_cells`): the plain and gated
#: arms' scores and kept fractions.
VALUES = ("plain", "kept_plain", "gated", "kept_gated")

#: Accuracies within this of each other are equal on the frontier (means of multiples of 1/m carry
#: last-bit noise, so exact comparisons would keep dominated points).
FRONTIER_TOL = 1e-9


def frontier_accuracy(kept: np.ndarray, accuracy: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Plain eviction's frontier accuracy at ``query`` kept KV, for many resamples at once.

    Parameters
    ----------
    kept, accuracy : ndarray (R, P)
        Per resample r, the mean kept KV and accuracy of plain eviction at each of P budgets.
    query : ndarray (R, Q)
        Kept KV at which to read the frontier.

    Returns
    -------
    ndarray (R, Q)
        The linear interpolation between the two Pareto points around each query; below the
        smallest kept KV the frontier is that point's accuracy (no budget keeps less), above the
        largest the largest point's.
    """
    kept, accuracy, query = (np.atleast_2d(np.asarray(a, dtype=np.float64)) for a in (kept, accuracy, query))
    order = np.lexsort((-accuracy, kept), axis=-1)  # by kept, the better point first among equal kept
    k = np.take_along_axis(kept, order, axis=-1)
    a = np.take_along_axis(accuracy, order, axis=-1)
    before = np.concatenate([np.full((a.shape[0], 1), -np.inf), np.maximum.accumulate(a, axis=-1)[:, :-1]], axis=-1)
    pareto = a > before + FRONTIER_TOL  # scores above every point that keeps no more KV
    q = query[:, :, None]  # (R, Q, 1) against (R, 1, P)
    kk, pp = k[:, None, :], pareto[:, None, :]
    left_ok = pp & (kk <= q)
    right_ok = pp & (kk >= q)
    n = k.shape[-1]
    idx = np.arange(n)
    # the last Pareto point at or below the query, the first at or above it (-1 / n when there is none)
    left = np.where(left_ok, idx, -1).max(axis=-1)
    right = np.where(right_ok, idx, n).min(axis=-1)
    first = np.argmax(pareto, axis=-1)[:, None].repeat(query.shape[1], axis=1)
    last = (n - 1 - np.argmax(pareto[:, ::-1], axis=-1))[:, None].repeat(query.shape[1], axis=1)
    left = np.where(left < 0, first, left)
    right = np.where(right >= n, last, right)
    kl, kr = np.take_along_axis(k[:, None, :].repeat(query.shape[1], 1), left[..., None], -1)[..., 0], \
        np.take_along_axis(k[:, None, :].repeat(query.shape[1], 1), right[..., None], -1)[..., 0]
    al, ar = np.take_along_axis(a[:, None, :].repeat(query.shape[1], 1), left[..., None], -1)[..., 0], \
        np.take_along_axis(a[:, None, :].repeat(query.shape[1], 1), right[..., None], -1)[..., 0]
    span = kr - kl
    weight = np.where(span > 0, (query - kl) / np.where(span > 0, span, 1.0), 0.0)
    return al + np.clip(weight, 0.0, 1.0) * (ar - al)


def _cells(rows, by: list[str]):
    """Per cell: its ``by`` values, its budgets (ascending), which of them are eviction budgets
    (:func:`pagestats.core.formulas.evicted`), and its (inputs × 4 budgets) matrix, inputs in key
    order: side by side, the plain and gated scores and kept fractions per budget
    (:func:`pagestats.core.formulas.kept_fraction`), in :data:`VALUES` order, read from SQL. The cells
    come in the order of their first input (run, task, input), then of ``by``: the order the
    resamples are drawn in, whatever the order of the rows."""
    key = names(INPUT_KEY)
    keys = ", ".join(f"c.{c}" for c in names(by).split(", ")) if by else ""
    cells = (f"(SELECT {names(by)}{', ' if by else ''}min(({key})) AS _first, count(DISTINCT ({key})) AS _inputs, "
             f"list_sort(list(DISTINCT budget)) AS _budgets, count(*) AS _rows FROM {ROWS} {grouped(by)})")
    order = f"ORDER BY c._first{', ' if by else ''}{keys}"
    shape = query(rows, f"SELECT * EXCLUDE (_first) FROM {cells} c {order}")
    on = " AND ".join(f"r.{c} IS NOT DISTINCT FROM c.{c}" for c in names(by).split(", ")) if by else "true"
    values = query(rows, f"""
        SELECT CAST(r.score_plain AS DOUBLE) AS plain, {formulas.kept_fraction("r.n_kept_plain")} AS kept_plain,
            CAST(r.score_gated AS DOUBLE) AS gated, {formulas.kept_fraction("r.n_kept_gated")} AS kept_gated
        FROM {ROWS} r JOIN {cells} c ON {on}
        {order}, {", ".join(f"r.{c}" for c in names([*INPUT_KEY, "budget"]).split(", "))}""")
    columns = [values[c].to_numpy() for c in VALUES]
    start = 0
    for cell, n, budgets, n_rows in zip(shape.select(by).iter_rows(named=True), shape["_inputs"], shape["_budgets"],
                                        shape["_rows"]):
        budgets = np.asarray(budgets, dtype=np.float64)
        if n_rows != n * budgets.size:
            raise ValueError("matched_memory: a cell's inputs do not all carry the same budgets")
        values = np.hstack([c[start:start + n_rows].reshape(n, budgets.size) for c in columns])
        start += n_rows
        yield cell, budgets, budgets < 1, values


def _resampled_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)`` a cell's resamples are drawn over (:func:`pagestats.stats.resample_counts`):
    the distinct rows of its (inputs × 4 budgets) matrix with their multiplicities, when there are at
    most 1/:data:`DISTINCT_ROWS_FACTOR` as many as inputs; else the inputs, one each."""
    rows, counts = np.unique(values, axis=0, return_counts=True)
    if len(counts) * DISTINCT_ROWS_FACTOR > len(values):
        return values, np.ones(len(values))
    return rows, counts


def _delta_matched(weights, evicted, values) -> tuple[np.ndarray, ...]:
    """Δ_matched per resample (rows of ``weights``: input counts) and the means it is built from
    (``evicted``: which budgets are eviction budgets; ``values``: a cell's matrix, :func:`_cells`).
    The four means come from one fixed-order product (:func:`pagestats.stats.weighted_sums`): each
    is summed over the inputs in their order, as four products of one matrix each would sum it."""
    means = stats.weighted_sums(weights, values) / weights.sum(axis=1, keepdims=True)
    mp, kp, mg, kg = np.split(means, len(VALUES), axis=1)
    mg, kg = mg[:, evicted], kg[:, evicted]
    matched = frontier_accuracy(kp, mp, kg)
    return (mg - matched).mean(axis=1), mg.mean(axis=1), kg.mean(axis=1), matched.mean(axis=1), \
        (mg - mp[:, evicted]).mean(axis=1)


def matched_memory(rows, by=("model", "context_length", "evictor"), *, rng: np.random.Generator,
                   n_boot: int = defaults.N_BOOTSTRAP, confidence_level: float = defaults.CONFIDENCE_LEVEL,
                   q: float = defaults.FDR_Q) -> pl.DataFrame:
    """Δ at matched memory per cell, with a cluster-bootstrap interval and BH-adjusted p (module docstring).

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`) with every budget, 1.0 included:
        ``run_id, task, input_id, budget, n_tokens, score_plain, n_kept_plain, score_gated,
        n_kept_gated`` and the ``by`` columns. Every input of a cell must carry the same budgets.
    by : sequence of str
        The cells.
    rng : numpy.random.Generator
        Draws the resamples (one generator for all cells, in the order of :func:`_cells`: each cell's
        first input, then ``by``); the rows come from SQL, the resampling is NumPy's.

    Returns
    -------
    polars.DataFrame
        ``by``, ``n_inputs``, ``kept_kv_gated`` (mean over b < 1 of the gated arm's mean kept KV),
        ``acc_gated``, ``acc_plain_matched`` (plain eviction's frontier at that kept KV, mean over
        b < 1), ``delta_matched`` with ``low``, ``high``, ``p_value``, ``p_adjusted``, and
        ``delta_nominal`` (Δ at the same nominal budget, for comparison).
    """
    return matched_cells(rows, by).resample(rng=rng, n_boot=n_boot, confidence_level=confidence_level, q=q)


def matched_cells(rows, by=("model", "context_length", "evictor")) -> MatchedCells:
    """The cells of :func:`matched_memory`, read from ``rows`` (its parameters) and checked; their
    :meth:`MatchedCells.resample` is the rest of it, in NumPy alone (the report runs it on a second
    thread while its replays run on the first: :meth:`pagestats.report.Context.start_matched_memory`)."""
    by = list(by)
    engine.check(rows, [*by, *INPUT_KEY, "budget", "n_tokens", "score_plain", "n_kept_plain", "score_gated",
                        "n_kept_gated"], "matched_memory")
    engine.refuse_repeats(rows, [*by, *INPUT_KEY, "budget"], "matched_memory",
                          "duplicate rows for the same (cell, input, budget)")
    cells = []
    for cell, budgets, evicted, values in _cells(rows, by):
        if not evicted.any() or not (budgets == 1.0).any():
            raise ValueError("matched_memory: a cell needs budget 1.0 (the full cache) and budgets b < 1")
        point = _delta_matched(np.ones((1, values.shape[0])), evicted, values)
        cells.append((cell, values.shape[0], evicted, point, *_resampled_rows(values)))
    if not cells:
        raise ValueError("matched_memory: no cells")
    return MatchedCells(cells)


@dataclass(frozen=True)
class MatchedCells:
    """The cells of one :func:`matched_memory` call, in :func:`_cells` order: per cell its ``by``
    values, inputs, eviction budgets, point estimates (:func:`_delta_matched`) and the rows its
    resamples are drawn over, with their counts (:func:`_resampled_rows`)."""

    cells: list

    def resample(self, *, rng: np.random.Generator, n_boot: int = defaults.N_BOOTSTRAP,
                 confidence_level: float = defaults.CONFIDENCE_LEVEL, q: float = defaults.FDR_Q,
                 stop: threading.Event | None = None) -> pl.DataFrame:
        """:func:`matched_memory`'s table (its parameters); ``stop``, once set (by another thread),
        ends the resampling between two chunks with :class:`concurrent.futures.CancelledError`."""
        out = []
        replicates = []
        alpha = 1.0 - confidence_level
        for cell, n, evicted, point, distinct, counts in self.cells:
            boot = []
            for chunk in stats.resample_counts(counts, n_boot, rng):
                if stop is not None and stop.is_set():
                    raise CancelledError("matched_memory: stopped")
                boot.append(_delta_matched(chunk, evicted, distinct)[0])
            boot = np.concatenate(boot)
            replicates.append(boot)
            low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
            out.append({**cell, "n_inputs": n, "kept_kv_gated": float(point[2][0]),
                        "acc_gated": float(point[1][0]), "acc_plain_matched": float(point[3][0]),
                        "delta_matched": float(point[0][0]), "low": float(low), "high": float(high),
                        "delta_nominal": float(point[4][0])})
        p = stats.bootstrap_pvalue(np.vstack(replicates))
        adjusted = stats.bh(p, q=q).adjusted
        return pl.DataFrame(out).with_columns(pl.Series("p_value", p), pl.Series("p_adjusted", adjusted))
