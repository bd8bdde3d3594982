"""Column conventions of every analysis frame: the cell keys, the input key, the column check,
and the two data-derived defaults (task class, headline evictor).

An *input* is identified by :data:`pagestats.core.schema.INPUT_KEY` (``run_id, task, input_id``),
plus ``pair_draw`` when a head-pair subsampling replay made several draws of D per input
(App. A.3.5). The paper aggregates inputs into *cells*:

* :data:`MODEL_CELL` — one (model, context) cell, the unit of the signal tables
  (Tables 3–10, 20, 24) and of the z-scored pilot (§4.1);
* :data:`MATRIX_CELL` — one (model, context, evictor) cell of the method-agnostic matrix
  (Table 2, Fig. 8);
* :data:`TASK_CELL` — a matrix cell broken down by task (Tables 1, 12);
* :data:`WHATIF_CELL` — one row of ``pagestats whatif``: a task cell at one budget b.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.core.schema import INPUT_KEY

MODEL_CELL = ("model", "context_length")
MATRIX_CELL = (*MODEL_CELL, "evictor")
TASK_CELL = (*MATRIX_CELL, "task")
WHATIF_CELL = (*TASK_CELL, "budget")


def require_columns(frame: pl.DataFrame, cols, what: str, *, non_empty: bool = False) -> None:
    """Raise a clear error when ``frame`` is not a polars frame, lacks ``cols`` or (with
    ``non_empty``) has no rows. The one column check of replay, metrics, tables and figures."""
    if not isinstance(frame, pl.DataFrame):
        raise TypeError(f"{what}: expected a polars DataFrame, got {type(frame).__name__}")
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: missing columns {missing}; frame has {frame.columns}")
    if non_empty and frame.height == 0:
        raise ValueError(f"{what}: the frame is empty")


def repeats_a_key(frame: pl.DataFrame, key) -> bool:
    """Whether two rows of ``frame`` hold the same values in the columns ``key`` (nulls equal), as
    ``frame.select(key).is_duplicated().any()`` says, without its hash table over the key columns.

    Each row is hashed to 64 bits (:meth:`polars.DataFrame.hash_rows`) and the hashes sorted; only
    the rows whose hash repeats are then compared on the key itself, so the answer is exact (a hash
    collision is never taken for a repeat). At 1M inputs a gated frame has 9M rows, whose hash
    table over the key took 1.9 GiB; the sorted hashes take 70 MiB (docs/PERFORMANCE.md).
    """
    keys = frame.select(key)
    hashes = keys.hash_rows()
    ordered = np.sort(hashes.to_numpy())
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if repeated.size == 0:
        return False
    return keys.filter(hashes.is_in(pl.Series(repeated).implode())).is_duplicated().any()


def sorting_order(frame: pl.DataFrame, cols) -> pl.Series | None:
    """The row order that sorts ``frame`` by ``cols`` (polars' arg sort, as ``frame.sort(cols)``
    orders them), or ``None`` when the rows are in that order already: then the columns
    themselves are the sorted columns, and no copy need be gathered (the outcomes a database
    reads, in key order; at 1M inputs every copy of them is a gigabyte)."""
    order = frame.select(pl.arg_sort_by(list(cols))).to_series()
    if (order == pl.int_range(frame.height, dtype=order.dtype, eager=True)).all():
        return None
    return order


def _starts(frame: pl.DataFrame, key) -> tuple[pl.Series, pl.Series]:
    """``(order, starts)``: the row order that sorts ``frame`` by ``key`` (polars' arg sort), and for
    each row in that order whether it starts a new value of the key (it differs from the row before
    in some key column, nulls equal). Each key column is gathered in that order one at a time."""
    order = frame.select(pl.arg_sort_by(list(key))).to_series()
    starts = None
    for c in key:
        column = frame.get_column(c).gather(order)
        differs = column.ne_missing(column.shift(1))
        starts = differs if starts is None else starts | differs
        del column
    return order, starts.scatter(0, True)  # the first row starts a value (also when its key is all null)


def key_codes(frame: pl.DataFrame, key, name: str = "_key") -> pl.Series:
    """One integer per row of ``frame``, equal for two rows exactly when they hold the same values
    in the columns ``key`` (nulls equal, as ``frame.select(key).n_unique()`` counts them).

    A count of distinct inputs per group is then ``pl.col(name).n_unique()`` over one integer
    column, not over a struct of the key columns, whose row encoding held a gigabyte for the
    9M gated rows of 1M inputs (docs/PERFORMANCE.md, "seventh round"). The codes come from the
    rows sorted by ``key``: no hash, so no collision to rule out.
    """
    if frame.height == 0:
        return pl.Series(name, [], pl.UInt32)
    order, starts = _starts(frame, key)
    codes = np.empty(frame.height, np.uint32)
    codes[order.to_numpy()] = starts.cast(pl.UInt32).cum_sum().to_numpy()
    return pl.Series(name, codes)


def distinct_rows(frame: pl.DataFrame, cols) -> pl.DataFrame:
    """``frame.select(cols).unique()`` (nulls equal; the rows in ``cols`` order), without unique's
    hash table over every row: the rows are sorted (:func:`key_codes`' order) and the first of
    each run of equal rows kept."""
    cols = list(cols)
    if frame.height == 0:
        return frame.select(cols)
    order, starts = _starts(frame, cols)
    return frame.select(pl.col(cols).gather(order.filter(starts)))


def names_like(frame: pl.DataFrame, like: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each column that ``like`` holds as text or as a categorical, and ``frame`` the
    other way, cast to ``like``'s type, so that the two frames join and stack (polars refuses a
    String key beside a Categorical one). Used where a frame made from literals or read back from
    SQL meets the report's frames, whose names are categorical
    (:func:`pagestats.io.categorical_names`); the same object when nothing differs."""
    def named(dtype) -> bool:
        return dtype == pl.String or isinstance(dtype, pl.Categorical)

    casts = {c: like.schema[c] for c, t in frame.schema.items()
             if c in like.schema and t != like.schema[c] and named(t) and named(like.schema[c])}
    return frame.cast(casts) if casts else frame


def rows_where(frame: pl.DataFrame, predicate: pl.Expr) -> pl.DataFrame:
    """``frame.filter(predicate)``, or ``frame`` itself when every row passes. A filter copies every
    column; at 1M inputs the report's gated rows of its one evictor are 9M rows, and a copy of
    them is a second gigabyte for nothing (docs/PERFORMANCE.md, "The report over a big release")."""
    mask = frame.select(predicate.fill_null(False)).to_series()
    return frame if mask.all() else frame.filter(mask)


def input_key(frame: pl.DataFrame) -> list[str]:
    """The columns that identify one input of ``frame``: :data:`INPUT_KEY`, plus ``pair_draw``
    when the frame holds several head-pair draws of D (App. A.3.5, Table 9)."""
    return [*INPUT_KEY, *(["pair_draw"] if "pair_draw" in frame.columns else [])]


def with_task_class(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``task_class`` column: kept where present (the loader takes it from the
    manifests' ``tasks``), else the default partition of :func:`pagestats.core.defaults.default_task_class`
    (§4 "The partition", Table 3)."""
    if "task_class" in frame.columns:
        return frame
    return frame.with_columns(
        pl.col("task").map_elements(defaults.default_task_class, return_dtype=pl.String).alias("task_class")
    )


def headline_evictor(evictors) -> str:
    """The evictor of the paper's single-evictor tables and figures: :data:`pagestats.core.defaults.HEADLINE_EVICTOR`
    (SnapKV, §4) when logged, else the first logged evictor by name."""
    names = sorted(set(evictors))
    if not names:
        raise ValueError("headline_evictor: no evictor is logged")
    return defaults.HEADLINE_EVICTOR if defaults.HEADLINE_EVICTOR in names else names[0]
