"""The gate signal's statistics per task: the task means of D that Table 3 prints and the ordering
margins of Tables 5–6, 9 and 10 compare. Conventions in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import polars as pl

from pagestats.core import formulas
from pagestats.core.columns import MODEL_CELL
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, names, query, uniq

__all__ = ["task_means"]


def task_means(rows, value: str = "drop", by=MODEL_CELL, *, sd: bool = True) -> pl.DataFrame:
    """Mean, SD (ddof = 1) and count of a per-input ``value`` per (``by``, task, task_class) (Table 3).

    Each input (and head-pair draw) counts once, so a relation of gated outcomes gives the result of
    the decisions it came from; an input whose rows disagree on ``value`` is refused. The sums are
    exact (:func:`pagestats.core.formulas.mean`; the SD sums the squared deviations from that mean as
    DECIMAL(38, 28)), so the result does not depend on the row order or on DuckDB's threads.

    Returns
    -------
    polars.DataFrame
        ``by``, ``task``, ``task_class``, ``mean`` and ``sd`` (over the non-null values; ``sd`` null
        below two) and ``n`` (the inputs, one with a null value included), sorted by the group.
        With ``sd=False`` no ``sd`` column: its exact sum is a second pass over the inputs (about a
        third of Table 9's time at 1M inputs), which the ordering margins (Tables 5–6, 9, 10, the
        k sweep) do not read.
    """
    by = engine.group_by(by, "task_means", rows)
    keys = uniq(by, ["task", "task_class"])
    engine.check(rows, [*keys, *engine.input_key(rows), value], "task_means")
    v = f'"{value}"'
    means = (f"SELECT {names(keys)}, {formulas.mean(v)} AS mean, count({v}) AS _k, count(*) AS n, "
             f"sum(CAST(_differs AS BIGINT)) AS _differs FROM one GROUP BY {names(keys)}")
    if sd:
        sql = f"""
            WITH one AS MATERIALIZED {engine.per_input(rows, keys, value)}, m AS ({means})
            SELECT {names(keys)}, any_value(m.mean) AS mean,
                   CASE WHEN any_value(m._k) > 1 THEN sqrt(CAST(sum(CAST(({v} - m.mean) ** 2 AS DECIMAL(38, 28)))
                        AS DOUBLE) / (any_value(m._k) - 1)) END AS sd,
                   any_value(m.n) AS n, any_value(m._differs) AS _differs
            FROM one JOIN m USING ({names(keys)}) GROUP BY {names(keys)}"""
    else:
        sql = f"WITH one AS {engine.per_input(rows, keys, value)} SELECT {names(keys)}, mean, n, _differs FROM ({means})"
    out = engine.refuse_differing(query(rows, sql), "task_means", value)
    return out.with_columns(pl.col("mean", *(["sd"] if sd else [])).cast(pl.Float64), pl.col("n").cast(pl.Int64)).sort(keys)
