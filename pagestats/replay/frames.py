"""The per-row frames at the edge, in polars: the decisions read back from SQL expanded to every
(evictor, budget) arm, the full-KV outcome substituted where the gate closes (Eq. 2).

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D).
"""

from __future__ import annotations

import polars as pl

from pagestats.core.columns import input_key, sorting_order, with_task_class
from pagestats.core.formulas import N_KEPT_GATED, SCORE_GATED
from pagestats.replay.spec import _require
from pagestats.core.schema import INPUT_KEY

GATE_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "n_tokens", "full_score", "drop", "tau", "gate_open",
)  # fmt: skip
GATED_OUTCOME_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "evictor", "budget", "n_tokens", "drop", "tau", "gate_open", "score_full", "score_plain",
    "score_gated", "n_kept_plain", "n_kept_gated",
)  # fmt: skip
#: The gated columns that Δ, p_open and their paired bootstrap read (:mod:`pagestats.metrics`): what a
#: table asks :func:`pagestats.replay.gated_outcomes` for (``columns=``) when it needs no more, to bound its memory.
DELTA_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "evictor", "budget", "tau", "gate_open", "score_plain", "score_gated",
)  # fmt: skip


def _outcome_rows(outcomes: pl.DataFrame, decisions: pl.DataFrame) -> pl.DataFrame:
    """The outcome rows with their input's decision columns. With one decision per input (no
    head-pair draws) the rows keep the outcomes' order and hold the outcomes' own columns (shared,
    not copied): only the decision columns are made, one value per outcome row."""
    _require(outcomes, [*INPUT_KEY, "evictor", "budget", "n_kept", "score"], "outcomes")
    own = outcomes.select(*INPUT_KEY, "evictor", "budget", "n_kept", "score")
    if "pair_draw" in decisions.columns:  # several decisions per input: the rows are repeated per draw
        rows = own.join(decisions, on=INPUT_KEY, how="left")
    else:
        aligned = own.select(INPUT_KEY).join(decisions, on=INPUT_KEY, how="left", maintain_order="left")
        rows = own.hstack(aligned.drop(INPUT_KEY).get_columns())
    orphans = rows.filter(pl.col("model").is_null())
    if orphans.height:
        raise ValueError(
            f"{orphans.height} outcome row(s) have no input row, e.g. {orphans.select(INPUT_KEY).row(0)}"
        )
    return rows


#: The columns of the decisions that the gated arm (Eq. 2) and the orphan check read.
_GATED_READS = ("model", "full_score", "n_tokens", "gate_open")


def gated_from_decisions(outcomes: pl.DataFrame, decisions: pl.DataFrame, columns=None) -> pl.DataFrame:
    """:func:`pagestats.replay.gated_outcomes` of the outcome rows ``outcomes`` under ``decisions`` (a
    :meth:`~pagestats.replay.Replay.decision_frame`: every input of the outcomes, ``held_out`` marking the
    inputs left out of the evaluated rows); only ``columns`` of :data:`GATED_OUTCOME_COLUMNS` when given.

    The same rows as the relation ``gated`` (:func:`pagestats.replay.relations.gated_query`), made in
    polars so that they share the outcomes' columns instead of copying them (docs/PERFORMANCE.md)."""
    if columns is not None:
        unknown = sorted(set(columns) - set(GATED_OUTCOME_COLUMNS))
        if unknown:
            raise ValueError(f"gated_outcomes: unknown columns {unknown}; expected some of {GATED_OUTCOME_COLUMNS}")
    wanted = GATED_OUTCOME_COLUMNS if columns is None else tuple(columns)
    keep = {*INPUT_KEY, "pair_draw", *_GATED_READS, *wanted}
    gates = decisions.select([c for c in GATE_COLUMNS if c in decisions.columns and c in keep])
    rows = _outcome_rows(outcomes, gates)  # every input decided, so that outcome rows all have one
    if decisions["held_out"].any():  # a held-out pilot: its inputs are not evaluated
        rows = rows.join(decisions.filter(~pl.col("held_out")).select(INPUT_KEY).unique(), on=INPUT_KEY, how="semi")
    derived = {
        "score_full": pl.col("full_score"),
        "score_plain": pl.col("score"),
        "score_gated": pl.sql_expr(SCORE_GATED),
        "n_kept_plain": pl.col("n_kept"),
        "n_kept_gated": pl.sql_expr(N_KEPT_GATED),
    }
    rows = rows.with_columns(expr.alias(name) for name, expr in derived.items() if name in wanted)
    cols = [c for c in GATED_OUTCOME_COLUMNS if c in rows.columns and c in wanted]
    order = [*input_key(rows), "evictor", "budget"]
    # rows.sort(order).select(cols), one column at a time (order is unique per row: no ties), each
    # unsorted column let go once gathered, so that the rows and their sorted copy are never both
    # whole (at 1M inputs each is a gigabyte); rows already in order (the outcomes of a database,
    # read in key order) are the answer as they are, their outcome columns shared with the logs'
    index = sorting_order(rows, order)
    if index is None:
        return rows.select(cols)
    columns = {c: rows.get_column(c) for c in cols}
    del rows
    return pl.DataFrame([columns.pop(c).gather(index) for c in cols])


def plain_outcomes(logs) -> pl.DataFrame:
    """The rows of :func:`pagestats.replay.gated_outcomes` for inputs the gate cannot decide (no D: an
    imported RULER sweep logs the plain arm alone, docs/IMPORT.md): the plain and full-KV arms, with
    ``tau``, ``gate_open``, ``score_gated`` and ``n_kept_gated`` null. ρ (Eq. 1) and Table 1 read
    these; nothing that needs the gate does."""
    inputs = with_task_class(logs.inputs).select("run_id", "task", "input_id", "model", "context_length", "task_class",
                                                 "n_tokens", "drop", pl.col("full_score").alias("score_full"))
    rows = logs.outcomes.select("run_id", "task", "input_id", "evictor", "budget", pl.col("score").alias("score_plain"),
                                pl.col("n_kept").alias("n_kept_plain")).join(inputs, on=["run_id", "task", "input_id"])
    return rows.with_columns(pl.lit(None, pl.Float64).alias("tau"), pl.lit(None, pl.Boolean).alias("gate_open"),
                             pl.lit(None, pl.Float64).alias("score_gated"), pl.lit(None, pl.Int64).alias("n_kept_gated")
                             ).select(*(c for c in GATED_OUTCOME_COLUMNS if c != "pair_draw"))
