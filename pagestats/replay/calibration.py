"""A pilot's threshold, set in SQL: the pilot moments, τ per group, and τ joined back to every
row (the ``calibrate`` methods of :mod:`pagestats.replay.policies` are written with these).

A policy's ``calibrate(con, source)`` draws its pilot (:mod:`pagestats.replay.pilot`) and
stores the pilot inputs and τ per group on ``con`` (:func:`store_calibration`: the tables
``_pilot_units`` and ``_pilot_tau``); :func:`decision_query` then gives every row of ``source``
its τ and pilot membership. :func:`decide_on_frame` runs that on a polars frame (the
policies' ``decide``); :mod:`pagestats.replay.sql` runs it on the logs.

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (z-scored variant: μ, σ with ddof = 1; Eq. 5).
"""

from __future__ import annotations

import polars as pl

from pagestats.formulas import GATE_RULE
from pagestats.replay.pilot import frame_query, pilot_query, refuse_small_groups
from pagestats.replay.sqltext import draw_columns, group_columns, join_on, quoted
from pagestats.schema import INPUT_KEY


def pilot_moments(source: str, pilot: str, by, groups, columns: dict[str, str]) -> str:
    """Per pilot group and head-pair draw, the pilot mean, sample SD (ddof=1) and size of each
    column of ``columns`` (``prefix → column``: ``{prefix}_mu``, ``{prefix}_sigma``, ``_n``;
    App. A.3.4), over the rows of ``source`` whose input is in the table ``pilot``. The values are
    aggregated in input order, so the moments do not depend on the row order of ``source``."""
    order = quoted(INPUT_KEY)
    stats = []
    for prefix, col in columns.items():
        values = f'list("{col}" ORDER BY {order})'
        stats += [f"list_avg({values}) AS {prefix}_mu", f"list_stddev_samp({values}) AS {prefix}_sigma"]
    return (f"SELECT {quoted(groups)}, {', '.join(stats)}, count(*) AS _n FROM {source} s "
            f"SEMI JOIN {pilot} p ON {join_on([*by, *INPUT_KEY], 's', 'p')} GROUP BY {quoted(groups)}")


def store_calibration(con, source: str, pilot: str, tau: str) -> None:
    """Materialise the pilot inputs (``_pilot_units``) and the threshold per group
    (``_pilot_tau``) on ``con``: small tables, joined back to every row by :func:`decision_query`."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_units AS {pilot}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_tau AS {tau}")


def refuse_one_input_pilots(con) -> None:
    """Raise ``ValueError`` if a pilot group of ``_pilot_tau`` has fewer than 2 inputs (σ undefined)."""
    small = con.sql("SELECT * EXCLUDE (tau) FROM _pilot_tau WHERE _n < 2 ORDER BY ALL LIMIT 3").fetchall()
    if small:
        raise ValueError(f"a pilot group has fewer than 2 inputs, σ is undefined: {small}")


def decision_query(source: str, groups, pilot_on) -> str:
    """Every row of ``source`` with the threshold ``tau`` of its group (``groups`` columns of
    ``_pilot_tau``) and ``in_pilot``: whether its input is a pilot input (``pilot_on`` columns of
    ``_pilot_units``), after a policy's ``calibrate``."""
    return (f"SELECT s.*, t.tau, p._in IS NOT NULL AS in_pilot FROM {source} s "
            f"LEFT JOIN _pilot_tau t ON {join_on(groups, 's', 't')} "
            f"LEFT JOIN (SELECT DISTINCT {quoted(pilot_on)}, true AS _in FROM _pilot_units) p "
            f"ON {join_on(pilot_on, 's', 'p')}")


def decide_on_frame(policy, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with ``in_pilot``, ``tau`` and ``gate_open`` (:data:`GATE_RULE`) added, row order
    kept: ``policy.calibrate`` and :func:`decision_query` run by DuckDB on ``frame``."""

    def query(con, source):
        groups, pilot_on = policy.calibrate(con, source)
        return f"SELECT in_pilot, tau FROM ({decision_query(source, groups, pilot_on)}) ORDER BY _row"

    decided = frame_query(frame, query)
    out = frame.with_columns(decided["in_pilot"], decided["tau"].cast(pl.Float64))
    return out.with_columns(pl.sql_expr(GATE_RULE).alias("gate_open"))


def standardised(policy, con, source: str, columns, moments: dict[str, str], tau_sql: str):
    """The calibration of :class:`~pagestats.replay.policies.ZScored` and
    :class:`~pagestats.replay.policies.RecalibratedTau`: the pilot of ``policy``
    (``pilot_by``, ``pilot_n``, ``pilot_split``, ``seed``; small groups refused), the pilot moments of
    ``moments`` (prefix → column) per pilot group and head-pair draw, and τ = ``tau_sql`` over
    them; returns what :meth:`~pagestats.replay.policies.ZScored.calibrate` returns."""
    by = group_columns(columns, policy.pilot_by, f"{type(policy).__name__}.pilot_by")
    groups = [*by, *draw_columns(columns)]
    refuse_small_groups(con, source, by, policy.pilot_n, policy.pilot_split)
    stats = pilot_moments(source, "_pilot_units", by, groups, moments)
    store_calibration(con, source, pilot_query(source, by, policy.pilot_n, policy.pilot_split, policy.seed),
                      f"SELECT *, {tau_sql} AS tau FROM ({stats})")
    refuse_one_input_pilots(con)
    return groups, [*by, *INPUT_KEY]
