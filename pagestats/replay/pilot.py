"""The calibration pilot, drawn in SQL: which inputs of each group set τ (§3 "Calibration").

The pilot is the first inputs of each group in a balanced order, or a seeded sample by
:func:`pilot_hash`; a polars frame gets the same query, run by DuckDB on the frame.

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (the unlabelled pilot of the z-scored variant);
§4.1 (the pilot definition left open).
"""

from __future__ import annotations

import hashlib

import polars as pl

from pagestats.io import duck
from pagestats.replay.sqltext import group_columns, join_on, quoted, sql_string
from pagestats.core.schema import INPUT_KEY
import pyarrow as pa

#: Canonical order of inputs inside a calibration group for the ``"first"`` pilot split: the first
#: inputs of every task in turn (input_id first, task only as a tie-break), so that a pilot
#: of n inputs is a balanced slice of the logged workload rather than n inputs of one task.
PILOT_ORDER = ["input_id", "task", "run_id"]
#: How a pilot is drawn (see :func:`pilot_mask`); ``"held-out"`` also removes the pilot
#: inputs from every evaluated number (:func:`pagestats.replay.gate`).
PILOT_SPLITS = ("first", "random", "held-out")

#: The name of :func:`pilot_hash` as a DuckDB function (:func:`register_functions`).
PILOT_HASH_FUNCTION = "pagestats_pilot_hash"


def pilot_hash(seeds, run_ids, tasks, input_ids) -> list[int]:
    """A seeded 63-bit hash of each input's identity (run_id, task, input_id).

    The order of a ``"random"`` / ``"held-out"`` pilot: it depends only on the input itself
    and the seed, so it is the same whatever the file order, the row order or the other
    runs loaded (BLAKE2b of ``"seed/run_id/task/input_id"``, first 8 bytes, big-endian,
    shifted right by one bit). DuckDB calls it as :data:`PILOT_HASH_FUNCTION`.
    """
    return [
        int.from_bytes(hashlib.blake2b(f"{int(s)}/{r}/{t}/{i}".encode(), digest_size=8).digest(), "big") >> 1
        for s, r, t, i in zip(seeds, run_ids, tasks, input_ids)
    ]


def _pilot_hash_arrow(seeds, run_ids, tasks, input_ids):

    return pa.array(pilot_hash(*(a.to_pylist() for a in (seeds, run_ids, tasks, input_ids))), type=pa.int64())


def register_functions(con) -> None:
    """Make :func:`pilot_hash` callable on the DuckDB connection ``con`` (a vectorised Arrow
    UDF, ``pagestats_pilot_hash(seed, run_id, task, input_id)``)."""
    known = con.sql(f"SELECT count(*) FROM duckdb_functions() WHERE function_name = {sql_string(PILOT_HASH_FUNCTION)}"
                    ).fetchall()[0][0]
    if not known:
        con.create_function(PILOT_HASH_FUNCTION, _pilot_hash_arrow, ["BIGINT", "VARCHAR", "VARCHAR", "BIGINT"],
                            "BIGINT", type="arrow", side_effects=False)


def _check_pilot(n: int, split: str) -> None:
    if split not in PILOT_SPLITS:
        raise ValueError(f"pilot split must be one of {PILOT_SPLITS}, got {split!r}")
    if int(n) != n or n < 1:
        raise ValueError(f"pilot size must be a positive integer, got {n}")


def pilot_query(source: str, by, n: int, split: str = "first", seed: int = 0) -> str:
    """The calibration pilot of each ``by`` group of the relation ``source``, as DuckDB SQL.

    The query gives the distinct pilot inputs (``by`` columns, ``run_id, task, input_id``):
    per group the first ``n`` inputs in (input_id, task, run_id) order (``"first"``), or the
    ``n`` of smallest :func:`pilot_hash` under ``seed``, ties in that order (``"random"``,
    ``"held-out"``). A group of fewer inputs gives all of them (:func:`refuse_small_groups`
    refuses it). Needs :func:`register_functions` on the connection for a hashed pilot.
    """
    _check_pilot(n, split)
    by = list(by)
    units = quoted([*by, *INPUT_KEY])
    order = [f"{c} NULLS FIRST" for c in quoted(PILOT_ORDER).split(", ")]
    if split != "first":
        order.insert(0, f"{PILOT_HASH_FUNCTION}({int(seed)}, run_id, task, input_id)")
    partition = f"PARTITION BY {quoted(by)} " if by else ""
    return (f"SELECT {units} FROM (SELECT DISTINCT {units} FROM {source}) "
            f"QUALIFY row_number() OVER ({partition}ORDER BY {', '.join(order)}) <= {int(n)}")


def pilot_need(pilot_n: int, split: str) -> int:
    """The inputs a group needs for a pilot of ``pilot_n`` drawn as ``split``: one more for a
    ``"held-out"`` pilot, which must leave an input to evaluate (App. A.3.4)."""
    return pilot_n + 1 if split == "held-out" else pilot_n


def refuse_small_groups(con, source: str, by, n: int, split: str) -> None:
    """Raise ``ValueError`` if a ``by`` group of ``source`` has fewer than ``n`` distinct inputs
    (``n`` + 1 for a held-out pilot, which must leave an input to evaluate)."""
    by = list(by)
    need = pilot_need(n, split)
    units = f"SELECT DISTINCT {quoted([*by, *INPUT_KEY])} FROM {source}"
    if by:
        query = (f"SELECT {quoted(by)}, count(*) AS len FROM ({units}) GROUP BY ALL HAVING count(*) < {int(need)} "
                 f"ORDER BY ALL NULLS FIRST LIMIT 1")
    else:
        query = f"SELECT count(*) AS len FROM ({units}) HAVING count(*) < {int(need)}"
    small = con.sql(query).fetchall()
    if small:
        row = dict(zip([*by, "len"], small[0]))
        group = ", ".join(f"{c}={row[c]}" for c in by) or "all inputs"
        raise ValueError(f"pilot of {n} inputs is larger than the data: {group} has {row['len']} input(s)"
                         + (" and a held-out pilot must leave one to evaluate" if split == "held-out" else ""))


def frame_query(frame: pl.DataFrame, query, *, con=None, lists=()) -> pl.DataFrame:
    """Run ``query(con, source)`` (a function returning SQL over the relation ``source``) on the
    scalar columns of ``frame`` (and those of ``lists`` it has) registered in DuckDB, with ``_row``
    (the row index) added."""
    scalar = [c for c, t in frame.schema.items() if not t.is_nested() or c in lists]
    own = con is None
    con = duck.connect(threads=1, memory_limit=duck.IN_MEMORY_REPLAY_LIMIT) if own else con  # one thread: bit-identical reruns
    try:
        register_functions(con)
        con.register("_gate_frame", frame.select(scalar).with_row_index("_row"))
        return con.sql(query(con, "_gate_frame")).pl()
    finally:
        if own:
            con.close()


def pilot_mask(frame: pl.DataFrame, by, n: int, split: str = "first", seed: int = 0, *,
               strict: bool = False) -> pl.Series:
    """Which rows of ``frame`` belong to the calibration pilot of their ``by`` group.

    Parameters
    ----------
    frame : polars.DataFrame
        Per-input rows (possibly repeated per ``pair_draw``).
    by : sequence of str
        Input-level grouping columns (e.g. ``("model",)``); one pilot per group.
    n : int
        Pilot size per group.
    split : {"first", "random", "held-out"}
        ``"first"``: the first ``n`` inputs in (input_id, task, run_id) order, i.e. the
        first inputs of every task in turn. ``"random"`` and ``"held-out"``: the ``n`` inputs
        of smallest :func:`pilot_hash` (a seeded uniform sample without replacement, the
        same whatever the file and row order); ``"held-out"`` pilots are then left out of
        every evaluated number by :func:`pagestats.replay.gate`.
    seed : int
        Seed of the hash (ignored for ``"first"``).
    strict : bool
        Refuse a group with fewer than ``n`` inputs (``n`` + 1 for ``"held-out"``, which must
        leave an input to evaluate); otherwise such a group uses all of its inputs.

    Returns
    -------
    polars.Series of bool, aligned with ``frame``.

    Notes
    -----
    The selection is made on distinct inputs, so every head-pair draw of an input is in or
    out of the pilot together.
    """
    _check_pilot(n, split)
    by = group_columns(frame.columns, by, "pilot_mask")
    units = [*by, *INPUT_KEY]

    def query(con, source):
        if strict:
            refuse_small_groups(con, source, by, n, split)
        return (f"SELECT p._in IS NOT NULL AS in_pilot FROM {source} s LEFT JOIN "
                f"(SELECT *, true AS _in FROM ({pilot_query(source, by, n, split, seed)})) p "
                f"ON {join_on(units, 's', 'p')} "
                f"ORDER BY s._row")

    return frame_query(frame, query)["in_pilot"]
