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


def task_means(rows, value: str = "drop", by=MODEL_CELL) -> pl.DataFrame:
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
    """
    by = engine.group_by(by, "task_means", rows)
    keys = uniq(by, ["task", "task_class"])
    engine.check(rows, [*keys, *engine.input_key(rows), value], "task_means")
    v = f'"{value}"'
    out = query(rows, f"""
        WITH one AS MATERIALIZED {engine.per_input(rows, keys, value)},
        m AS (SELECT {names(keys)}, {formulas.mean(v)} AS mean, count({v}) AS _k, count(*) AS n,
                     sum(CAST(_differs AS BIGINT)) AS _differs FROM one GROUP BY {names(keys)})
        SELECT {names(keys)}, any_value(m.mean) AS mean,
               CASE WHEN any_value(m._k) > 1 THEN sqrt(CAST(sum(CAST(({v} - m.mean) ** 2 AS DECIMAL(38, 28)))
                    AS DOUBLE) / (any_value(m._k) - 1)) END AS sd,
               any_value(m.n) AS n, any_value(m._differs) AS _differs
        FROM one JOIN m USING ({names(keys)}) GROUP BY {names(keys)}""")
    out = engine.refuse_differing(out, "task_means", value)
    return out.with_columns(pl.col("mean", "sd").cast(pl.Float64), pl.col("n").cast(pl.Int64)).sort(keys)
