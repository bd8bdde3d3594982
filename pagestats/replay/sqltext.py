"""The SQL text the replay's DuckDB queries are written with: literals, quoted column lists,
join conditions, and the columns of a relation.
It imports nothing of pagestats.
"""

from __future__ import annotations


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def sql_float(value: float) -> str:
    """``value`` as an exact SQL DOUBLE literal (its shortest round-trip repr)."""
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def quoted(cols, alias: str = "") -> str:
    """The columns ``cols`` as a comma-separated list of quoted names (each prefixed by ``alias``)."""
    return ", ".join(f'{alias}"{c}"' for c in cols)


def join_on(cols, left: str, right: str) -> str:
    """The join condition of ``left`` and ``right`` on equal ``cols`` (``TRUE`` when there are none)."""
    return " AND ".join(f'{left}."{c}" = {right}."{c}"' for c in cols) or "TRUE"


def relation_columns(con, source: str) -> list[str]:
    """The column names of the relation ``source`` on the DuckDB connection ``con``."""
    return [row[0] for row in con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()]


def draw_columns(columns) -> list[str]:
    """``["pair_draw"]`` when ``columns`` hold head-pair draws, else ``[]``."""
    return ["pair_draw"] if "pair_draw" in columns else []


def group_columns(columns, cols, what: str) -> list[str]:
    """``cols`` as a list, refused (``ValueError`` naming ``what``) unless all are among ``columns``."""
    cols = list(cols)
    missing = [c for c in cols if c not in columns]
    if missing:
        raise ValueError(f"{what}: grouping columns {missing} are not in the gate frame {list(columns)}")
    return cols
