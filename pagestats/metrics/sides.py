"""The two sides a table contrasts, as the paper names them: the capacity-bound anchor and the
dilution-prone tasks (§4 "The partition").

The paper's tables read the capacity-bound side on one task, NIAH-MK3
(:data:`pagestats.core.defaults.ANCHOR_TASKS`: Table 1's pooled 2/526, Table 2's "excluding NIAH-MK3",
Tables 5–6, 9–10, 12, 14, 27, 29–30, Fig. 7), not on the whole capacity-bound class, whose
second member niah_multiquery (Table 3) is in none of them. Class membership stays data (the
``task_class`` column, from the run manifests); the anchor is a set of task names a table is
given, ``None`` meaning the capacity-bound class itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats.core import defaults, formulas
from pagestats.replay.sqltext import sql_string

__all__ = ["capacity_sql", "capacity_side", "dilution_side", "anchor_name"]


def capacity_sql(anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> str:
    """The capacity-bound side as SQL, true on its rows: the tasks of ``anchor``, or, with ``None``,
    the rows whose ``task_class`` is capacity-bound (a relation's filter; :func:`capacity_side` is
    the same text in polars)."""
    if anchor is None:
        return f"task_class = {sql_string(defaults.CAPACITY_BOUND)}"
    if not anchor:
        raise ValueError("an anchor names at least one task (None: the capacity-bound class)")
    return f"task IN ({', '.join(sql_string(t) for t in anchor)})"


def capacity_side(anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.Expr:
    """:func:`capacity_sql` as a polars expression."""
    return formulas.expr(capacity_sql(anchor))


def dilution_side(anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.Expr:
    """True on the rows of the dilution-prone tasks (``task_class``) outside ``anchor``: the other side
    of Tables 1, 5–6 and 9 ("the dilution-prone tasks"). The rest of the rows, every task outside the
    anchor, is ``~capacity_side(anchor)`` (Tables 2, 10, 12, 14 and Fig. 7: "the other tasks")."""
    return (pl.col("task_class") == defaults.DILUTION_PRONE) & ~capacity_side(anchor)


def anchor_name(anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> str:
    """How a table names its capacity-bound side: the anchor's tasks joined by "+", or
    "capacity-bound" for the class."""
    return defaults.CAPACITY_BOUND if anchor is None else "+".join(anchor)
