"""Evictors whose outcomes are identical: cells of a matrix that are not independent.

Two evictors of a (model, context) can produce the same outcome on every evicting row: the
release's Qwen2.5-14B H2O equals its SnapKV on all 600 evicting rows (the authors' audit: a
two-pass prefill made H2O score like SnapKV; PAGE §4.1, Table 2's "†Qwen2.5-14B H2O is not an
independent cell"), and at a budget whose ⌊b·T⌋ is below the protected positions every evictor
keeps the same sinks and recent window (the budget rule, App. A.2.3; Table 26). Their cells then
agree by construction, not as a finding, and a table says so beside them.
"""

from __future__ import annotations

import polars as pl

from pagestats.core import formulas
from pagestats.core.columns import MODEL_CELL
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, names, query
from pagestats.replay.sqltext import sql_float, sql_string

__all__ = ["identical_evictors"]

#: The outcome columns compared: the plain arm's score and kept tokens.
OUTCOME = ("score_plain", "n_kept_plain")


def _row_hash(cols) -> str:
    """The SQL of one row's 64-bit hash over ``cols``."""
    return f"hash({names(cols)})"


def _equals(column: str, value) -> str:
    """SQL: ``column`` holds ``value`` (nulls equal)."""
    literal = ("NULL" if value is None else sql_string(value) if isinstance(value, str)
               else sql_float(value) if isinstance(value, float) else str(int(value)))
    return f'"{column}" IS NOT DISTINCT FROM {literal}'


def identical_evictors(rows, by=MODEL_CELL) -> pl.DataFrame:
    """Per (``by``, evictor): the other evictors of the group whose outcomes equal this one's on every
    evicting row.

    An evicting row is one at a budget b < 1 (:func:`pagestats.core.formulas.evicted`). Two evictors are
    identical in a group when they hold the same (input, budget) rows there and their plain outcomes,
    ``score_plain`` and ``n_kept_plain``, are equal on every one of them; their gated outcomes are then
    equal too (Eq. 2: where the gate opens the gated arm is the plain outcome, elsewhere the full cache,
    the same for both), so their rows of every table agree by construction.

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`), or any relation with ``by``, ``evictor``, the
        input key, ``budget``, ``score_plain`` and ``n_kept_plain``.
    by : sequence of str
        The groups whose evictors are compared (default the (model, context) cell; add ``budget`` to
        compare at each budget).

    Returns
    -------
    polars.DataFrame
        ``by``, ``evictor``, ``n_rows`` (evicting rows of the evictor in the group) and ``same_as``
        (the other identical evictors of the group, sorted and joined by ", "; null when none).
        Groups without an evicting row are left out.

    Notes
    -----
    Each evictor's rows are summed as 64-bit hashes of (input, budget, outcome) per group, in SQL:
    evictors whose row counts and sums differ are not identical. Those whose sums agree are compared
    row by row (``EXCEPT ALL``), so a hash collision never makes two evictors identical.
    """
    by = [by] if isinstance(by, str) else list(by)
    key = [c for c in [*engine.input_key(rows), "budget"] if c not in by]
    engine.check(rows, [*by, "evictor", *key, *OUTCOME], "identical_evictors")
    evicting = f"FROM {ROWS} WHERE {formulas.evicted()}"
    group = [*by, "evictor"]
    sig = query(rows, f"SELECT {names(group)}, count(*) AS n_rows, CAST(sum({_row_hash([*key, *OUTCOME])}) AS VARCHAR) "
                      f"AS _sig {evicting} GROUP BY {names(group)}").with_columns(pl.col("n_rows").cast(pl.Int64))
    candidates = (sig.group_by([*by, "n_rows", "_sig"]).agg(pl.col("evictor").sort())
                  .filter(pl.col("evictor").list.len() > 1))
    same: list[dict] = []
    for row in candidates.iter_rows(named=True):
        where = " AND ".join(_equals(c, row[c]) for c in by) or "true"

        def outcomes(ev):
            return f"SELECT {names([*key, *OUTCOME])} {evicting} AND {where} AND {_equals('evictor', ev)}"

        classes: list[list[str]] = []
        for ev in row["evictor"]:
            for members in classes:
                if not query(rows, f"SELECT count(*) FROM ({outcomes(members[0])} EXCEPT ALL {outcomes(ev)})").item():
                    members.append(ev)  # as many rows (the signature) and none of the first's missing: the same rows
                    break
            else:
                classes.append([ev])
        for members in classes:
            for ev in members if len(members) > 1 else ():
                same.append({**{c: row[c] for c in by}, "evictor": ev,
                             "same_as": ", ".join(str(m) for m in members if m != ev)})
    out = sig.drop("_sig")
    if same:
        found = pl.DataFrame(same, schema={**{c: out.schema[c] for c in by}, "evictor": out.schema["evictor"],
                                           "same_as": pl.String})
        out = out.join(found, on=[*by, "evictor"], how="left", nulls_equal=True)
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("same_as"))
    return out.select(*by, "evictor", "n_rows", "same_as").sort([*by, "evictor"])
