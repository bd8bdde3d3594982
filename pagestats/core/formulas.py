"""The gate rule, the gated arm and the aggregates of the per-cell metrics, each written once, as SQL.

DuckDB evaluates the aggregates (:mod:`pagestats.metrics`, :mod:`pagestats.replay.whatif`,
:func:`pagestats.replay.tau_curve`); the gate rule and the gated arm are also evaluated by polars
on the per-row frames at the edge (:func:`polars.sql_expr`: :mod:`pagestats.replay.frames`), so a
formula cannot mean one thing in memory and another out of core. Every mean is :func:`mean`,
summed exactly: its last bits do not depend on the order the engine's threads add the terms in. The gate rule reads a per-input row (``drop``,
``tau``); the gated arm an outcome row joined with its input's decision (``score``,
``n_kept``, ``full_score``, ``n_tokens``, ``gate_open``); the aggregates a gated-outcome row
(``score_full``, ``score_plain``, ``score_gated``, ``n_kept_*``, ``n_tokens``, ``gate_open``).
A foundation module: it imports only polars, so the out-of-core path does not load SciPy.

References
----------
PAGE paper, §3 (Eq. 2: the gate rule and the gated arm); Table 13 (accuracy); Table 27
(harm); Tables 12 and 22 (p_open, kept-KV).
"""

from __future__ import annotations

import polars as pl

#: The gate rule (§3, Eq. 2): open (evict) iff D ≥ τ.
GATE_RULE = '"drop" >= tau'


def opens(drop, tau):
    """:data:`GATE_RULE` on values: D ≥ τ, elementwise on NumPy arrays, polars Series or expressions
    (e.g. ``opens(pl.col("drop"), pl.col("tau"))``), or on floats."""
    return drop >= tau


def open_count(drop, tau) -> int:
    """The inputs whose gate opens at ``tau`` (:func:`opens`): p_open's numerator on values."""
    return int(opens(drop, tau).sum())

#: The gated arm (Eq. 2): the plain outcome where the gate opens, else the full-KV outcome.
SCORE_GATED = "CASE WHEN gate_open THEN score ELSE full_score END"
N_KEPT_GATED = "CASE WHEN gate_open THEN n_kept ELSE n_tokens END"


def with_full(aggregate: str) -> str:
    """``aggregate`` over a group's rows, or null when any of them lacks the full-KV outcome
    (``score_full`` null: an imported file without b = 1 rows, docs/IMPORT.md). SQL's aggregates skip
    nulls, so without this a mean over the known rows would pass for the group's."""
    return f"CASE WHEN count(score_full) = count(*) THEN {aggregate} END"


def known_count(column: str) -> str:
    """The count of true ``column`` over a group (ρ's recovered units), null when any is unknown
    (:func:`with_full`)."""
    return f"CASE WHEN count({column}) = count(*) THEN sum(CAST({column} AS BIGINT)) END"


def mean(value: str) -> str:
    """The mean of ``value`` over a group, summed exactly: the terms as DECIMAL(38, 18) (scores,
    paired differences and kept fractions lie in [−1, 1]), so the sum does not depend on the order
    the engine's threads add them in and a rerun is bit-identical (parallel float sums differ in
    their last bits). A term is rounded to 18 decimals first: a mean differs from the float mean of
    the same terms by at most 1e-18 (a unit in the last place of a value near 0.01)."""
    return f"avg(CAST({value} AS DECIMAL(38, 18)))"


#: Mean accuracy of each arm over the rows of a group (Table 13).
ACCURACY = {"acc_full": with_full(mean("score_full")), "acc_plain": mean("score_plain"),
            "acc_gated": mean("score_gated")}


def harm_count(score: str) -> str:
    """Harm events of an arm: rows with ``A(b, x) < A(1, x)`` (App. A.7.1, Table 27); null for a group
    with an unknown full-KV outcome (:func:`with_full`)."""
    return with_full(f"sum(CAST({score} < score_full AS BIGINT))")


#: The paired difference of the gate's effect Δ per (input, budget) (Table 2; App. A.7.2).
PAIRED_DIFFERENCE = "score_gated - score_plain"
#: Δ of a group from its arms' mean accuracies (:data:`ACCURACY`), the mean of
#: :data:`PAIRED_DIFFERENCE` over the same rows (Table 2).
DELTA = "acc_gated - acc_plain"


def recovered(score: str) -> str:
    """Per unit: some eviction budget strictly beats the full cache, ``max_b A(b, x) > A(1, x)``
    (ρ's event, §3 Eq. 1), over the unit's rows with b < 1 (``score_full`` is constant in a unit)."""
    return with_full(f"max({score}) > min(score_full)")


def group_tau(column: str = "tau") -> str:
    """A group's τ, over its rows (§3 "Calibration"): a policy sets one τ per calibration group and
    head-pair draw, repeated on each of its rows, and that value is the group's τ as it is; over
    head-pair draws (one τ each) or a policy without one τ per group it is their mean. The value
    itself, not a mean of equal copies, so that the result does not round with the summation order."""
    return f"CASE WHEN min({column}) = max({column}) THEN min({column}) ELSE avg({column}) END"


#: Gate-open rows (p_open's numerator; Tables 12, 22).
OPEN_COUNT = "sum(CAST(gate_open AS BIGINT))"
#: p_open of a group of per-input rows (each input, and head-pair draw, once): the share whose gate opens.
P_OPEN = f"{OPEN_COUNT} / count(*)"

#: A degenerate gate, over a cell's ``p_open``: it opens on none or on all of the cell's inputs, so
#: Δ measures the threshold, not the signal ("its gate-open fraction is 0.00. The gate has silently
#: become full-KV fallback", App. A.3.1).
DEGENERATE = "p_open = 0 OR p_open = 1"


def kept_fraction(kept: str) -> str:
    """Per-row kept-KV fraction ``n_kept / n_tokens`` of an arm (App. A.6.2, Table 22)."""
    return f"CAST({kept} AS DOUBLE) / n_tokens"


def expr(sql: str) -> pl.Expr:
    """The polars expression of a formula."""
    return pl.sql_expr(sql)


def evicted(alias: str = "") -> str:
    """The rows of an eviction budget, ``b < 1`` (b = 1 is the full cache, §3): the budgets every
    ``max_b`` (Eq. 1) and every mean over budgets reads (Tables 2, 12, 13). ``alias`` qualifies the
    column (``evicted("o")`` is ``o.budget < 1``)."""
    return f"{alias}.budget < 1" if alias else "budget < 1"


#: The polars filter of :func:`evicted`: ``frame.filter(formulas.EVICTED)``.
EVICTED = expr(evicted())
