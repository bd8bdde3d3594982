"""The engine every metric runs on: a DuckDB relation with the columns of the replay's ``gated``
relation (:meth:`pagestats.replay.Replay.gated_relation`), or some of them, and the checks a metric makes on it.

A metric takes the relation and returns a polars frame: the SQL runs on the relation's own
connection, the replay's when the relation is ``session.con.table("gated")``, and only the result
rows reach polars. :func:`relation` puts a polars frame (a table's selection of the gated rows, a
test's hand-built rows) on the metrics' connection, and :func:`on_frame` runs a metric over one.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import duckdb
import numpy as np
import polars as pl

from pagestats import stats
from pagestats.core.columns import names_like, repeats_a_key
from pagestats.core.schema import INPUT_KEY
from pagestats.io import duck

#: The relation name a metric's SQL reads its rows from (:meth:`duckdb.DuckDBPyRelation.query`).
ROWS = "_rows"

#: The connection of :func:`relation`, one per thread (a DuckDB connection is not thread-safe; the
#: report runs some tables on a second thread, :attr:`pagestats.report.Entry.beside`).
_CONNECTION = threading.local()


#: Within :func:`checked_once_per_frame`: id(frame) -> (a weak reference to the frame, the keys found
#: unique in it), the set each of the frame's relations shares (:data:`_NO_REPEATS`).
_FRAME_KEYS: list[dict] = []

#: Per relation of a whole polars frame (:func:`relation`), that frame: :func:`refuse_repeats` checks it there.
_FRAME_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def relation(frame: pl.DataFrame) -> duckdb.DuckDBPyRelation:
    """``frame`` as a DuckDB relation (by reference: its numeric columns are not copied; its
    categorical ones are: 70–100 MB for two of them at 9M rows, measured), on one connection kept
    for the thread (:func:`pagestats.io.duck.connect`, the in-memory replay's memory limit); within
    :func:`checked_once_per_frame`, the keys found unique in one relation of the frame count for all."""
    if not isinstance(frame, pl.DataFrame):
        raise TypeError(f"expected a polars DataFrame, got {type(frame).__name__}")
    if not hasattr(_CONNECTION, "con"):
        _CONNECTION.con = duck.connect(memory_limit=duck.IN_MEMORY_REPLAY_LIMIT)
    rel = _CONNECTION.con.from_arrow(frame)
    _FRAME_OF[rel] = frame
    if _FRAME_KEYS:
        memo, key = _FRAME_KEYS[-1], id(frame)
        if key not in memo or memo[key][0]() is not frame:  # the entry goes when the frame does
            memo[key] = (weakref.ref(frame, lambda _, key=key: memo.pop(key, None)), set())
        _NO_REPEATS[rel] = memo[key][1]
    return rel


@contextlib.contextmanager
def checked_once_per_frame():
    """Within: the metrics over one frame (each through its own :func:`relation`) check a key of it
    for repeats once (:func:`refuse_repeats`). A frame changed in place (polars' ``__setitem__``,
    ``replace_column``) would keep its old record: only code that never does so runs within (the
    report: :func:`pagestats.report.build_report`). The relations are not kept: each holds a copy
    of the frame's categorical columns (70–100 MB for two of them at 9M rows)."""
    _FRAME_KEYS.append({})
    try:
        yield
    finally:
        _FRAME_KEYS.pop()


def on_frame(metric, frame: pl.DataFrame, *args, **kwargs) -> pl.DataFrame:
    """``metric`` over the rows of a polars frame (:func:`relation`), its name columns typed as the
    frame's (text comes back from SQL as :class:`polars.String`; :func:`pagestats.core.columns.names_like`)."""
    return on_rows(metric, relation(frame), frame, *args, **kwargs)


def on_rows(metric, rows: duckdb.DuckDBPyRelation, like: pl.DataFrame, *args, **kwargs) -> pl.DataFrame:
    """``metric`` over the relation ``rows`` (some rows of the frame ``like``), its name columns typed as
    ``like``'s (:func:`on_frame`)."""
    return names_like(metric(rows, *args, **kwargs), like)


def names(columns) -> str:
    """Column names as a SQL list, each quoted."""
    return ", ".join(f'"{c}"' for c in columns)


def query(rows: duckdb.DuckDBPyRelation, sql: str) -> pl.DataFrame:
    """``sql`` over ``rows`` (named :data:`ROWS` in it), as a polars frame."""
    return rows.query(ROWS, sql).pl()


def by_groupings(rows, groupings, aggregates: str, where: str = "") -> list[pl.DataFrame]:
    """``aggregates`` (SQL select items, each named) over ``rows`` grouped by each of ``groupings``
    (lists of columns), in one scan: GROUPING SETS, or a plain GROUP BY for one. Frame i holds the
    columns of ``groupings[i]`` and the aggregates, one row per group, in no particular order."""
    cols = uniq(*groupings)
    sets = list(dict.fromkeys(tuple(g) for g in groupings))
    lead = f"{names(cols)}, " if cols else ""
    if len(sets) == 1:
        out = query(rows, f"SELECT {lead}{aggregates} FROM {ROWS} {where} {grouped(cols)}")
        return [out] * len(groupings)
    out = query(rows, f"SELECT {lead}{aggregates}, grouping({names(cols)}) AS _set FROM {ROWS} {where} "
                      f"GROUP BY GROUPING SETS ({', '.join(f'({names(g)})' for g in sets)})")
    values = [c for c in out.columns if c not in (*cols, "_set")]

    def of(by) -> pl.DataFrame:  # grouping() sets the bit of each column the set leaves out, the first highest
        mask = sum(1 << (len(cols) - 1 - i) for i, c in enumerate(cols) if c not in by)
        return out.filter(pl.col("_set") == mask).select(*by, *values)

    return [of(g) for g in groupings]


def check(rows, cols, what: str) -> None:
    """Raise a clear error when ``rows`` is not a DuckDB relation or lacks ``cols``."""
    if not isinstance(rows, duckdb.DuckDBPyRelation):
        raise TypeError(f"{what}: expected a DuckDB relation (pagestats.metrics.relation(frame)), "
                        f"got {type(rows).__name__}")
    missing = [c for c in cols if c not in rows.columns]
    if missing:
        raise ValueError(f"{what}: missing columns {missing}; the relation has {rows.columns}")


def input_key(rows) -> list[str]:
    """The columns that identify one input: :data:`INPUT_KEY`, plus ``pair_draw`` when present."""
    return [*INPUT_KEY, *(["pair_draw"] if "pair_draw" in rows.columns else [])]


def unit_key(rows) -> list[str]:
    """A unit, one input under one evictor (the conventions of :mod:`pagestats.metrics`)."""
    return [*input_key(rows), *(["evictor"] if "evictor" in rows.columns else [])]


def uniq(*parts) -> list[str]:
    return list(dict.fromkeys(c for part in parts for c in part))


def group_by(by, what: str, rows) -> list[str]:
    """``by`` as a list, checked: its columns are present, and a relation with several head-pair
    draws (``pair_draw``) has it in ``by`` (else one input would count once per draw)."""
    by = [by] if isinstance(by, str) else list(by)
    check(rows, by, what)
    if "pair_draw" in rows.columns and "pair_draw" not in by and \
            query(rows, f"SELECT count(DISTINCT pair_draw) FROM {ROWS}").item() > 1:
        raise ValueError(f"{what}: the rows hold several pair_draw values; add 'pair_draw' to by")
    return by


#: Per relation, the keys it was found to hold once each (:func:`refuse_repeats`): a relation's rows do
#: not change, so the metrics over one relation (one :func:`relation` of a table's rows) check a key once.
_NO_REPEATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def refuse_repeats(rows, key, what: str, message: str = "duplicate rows for the same (input, evictor, budget)") -> None:
    """Raise when two rows of ``rows`` hold the same ``key`` (nulls equal); checked once per relation and key.
    A relation of a whole polars frame is checked on the frame (:func:`pagestats.core.columns.repeats_a_key`,
    sorted row hashes: 0.7 s against DuckDB's 2.0 s for a GROUP BY of the key, 9M gated rows, measured)."""
    checked = _NO_REPEATS.setdefault(rows, set())
    if tuple(key) in checked:
        return
    frame = _FRAME_OF.get(rows)
    if repeats_a_key(frame, key) if frame is not None else query(
            rows, f"SELECT count(*) FROM (SELECT 1 FROM {ROWS} GROUP BY {names(key)} HAVING count(*) > 1)").item():
        raise ValueError(f"{what}: {message}")
    checked.add(tuple(key))


def known_unique(rows, key) -> None:
    """Record that ``rows`` holds each ``key`` once, known from how it was made rather than by a scan:
    gated rows that join outcome rows checked by :func:`refuse_repeats` to one decision per input (and
    head-pair draw); decisions, one row per input and draw. The metrics over ``rows`` then do not
    check ``key`` again, and with the input key (:func:`input_key`) read each row as one input's
    (:func:`per_input`)."""
    _NO_REPEATS.setdefault(rows, set()).add(tuple(key))


def per_input(rows, by, value: str) -> str:
    """SQL of one row per input (and head-pair draw) of ``rows`` within each ``by`` group: its
    ``by`` and input columns, ``value`` (the input's value, whatever row it is read from) and
    ``_differs`` (its rows do not all hold one ``value``, a null counting as a value), in one
    aggregation (per-input metrics on gated outcomes read every input once; :func:`refuse_differing`).
    Rows known to hold one row per input (:func:`known_unique` of the input key: a block of
    decisions) are read as they are."""
    key = names(uniq(by, input_key(rows)))
    v = f'"{value}"'
    if tuple(input_key(rows)) in _NO_REPEATS.get(rows, ()):  # one row per input already: nothing to gather
        return f"(SELECT {key}, {v}, false AS _differs FROM {ROWS})"
    return (f"(SELECT {key}, any_value({v}) AS {v}, coalesce(min({v}) <> max({v}), false) OR count({v}) NOT IN "
            f"(0, count(*)) AS _differs FROM {ROWS} GROUP BY {key})")


def refuse_differing(out: pl.DataFrame, what: str, value: str) -> pl.DataFrame:
    """``out`` without its ``_differs`` column (the number of inputs whose rows disagree on ``value``,
    :func:`per_input`); raise when any input's do."""
    if out.height and out["_differs"].sum():
        raise ValueError(f"{what}: {value} differs between rows of the same input")
    return out.drop("_differs")


def outcome_rows(rows, by, cols, what: str) -> list[str]:
    """Check an outcome relation: ``by`` (:func:`group_by`), the unit key, ``budget`` and ``cols``
    present, no (unit, budget) twice. Returns ``by`` as a list."""
    by = group_by(by, what, rows)
    key = [*unit_key(rows), "budget"]
    check(rows, [*key, *cols], what)
    refuse_repeats(rows, key, what)
    return by


def grouped(sql_by) -> str:
    """``GROUP BY`` of the columns ``sql_by`` (nothing for none: one group)."""
    return f"GROUP BY {names(sql_by)}" if sql_by else ""


def with_wilson(df: pl.DataFrame, name: str, confidence_level: float) -> pl.DataFrame:
    """Add ``name`` (= k/n), ``low`` and ``high`` from the ``k``/``n`` columns (Wilson interval,
    :func:`pagestats.stats.wilson`); null where ``k`` is unknown (a full-KV outcome is,
    :func:`pagestats.core.formulas.with_full`)."""
    if df.height == 0:
        return df.with_columns(pl.lit(None, pl.Float64).alias(c) for c in (name, "low", "high"))
    known = df["k"].is_not_null().to_numpy()
    out = {c: np.full(df.height, np.nan) for c in (name, "low", "high")}
    if known.any():
        iv = stats.wilson(df["k"].to_numpy()[known], df["n"].to_numpy()[known], confidence_level)
        for c, v in ((name, iv.estimate), ("low", iv.low), ("high", iv.high)):
            out[c][known] = np.atleast_1d(v)
    return df.with_columns(pl.Series(c, v).fill_nan(None) for c, v in out.items())
