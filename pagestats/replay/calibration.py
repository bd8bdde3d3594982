"""The policy contract and a pilot's threshold, set in SQL: :class:`Policy` (one
``calibrate(con, source)``), the pilot moments, τ per group, and τ joined back to every row.

A policy with a pilot stores the pilot inputs and τ per group on the connection (the tables
``_pilot_units`` and ``_pilot_tau``), joined back to every row; :meth:`Policy.record` reads what set τ there.

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (z-scored variant: μ, σ with ddof = 1; Eq. 5).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import polars as pl

from pagestats.core.formulas import GATE_RULE
from pagestats.core.registry import short_name
from pagestats.replay.pilot import frame_query, pilot_query, refuse_small_groups
from pagestats.replay.sqltext import draw_columns, group_columns, join_on, quoted, relation_columns
from pagestats.core.schema import INPUT_KEY


class Policy(ABC):
    """How τ is chosen (§3 "Calibration"); the gate opens iff D ≥ τ (Eq. 2).

    A subclass writes :meth:`calibrate` and :attr:`name`, and says what it needs in class
    attributes, so that no caller asks which policy it has.
    """

    #: What the policy needs besides D (Table 8), and where the report applies it.
    labels: ClassVar[str] = ""
    used_in: ClassVar[str] = ""
    #: Whether τ is set on a calibration pilot (its inputs are reported: ``whatif``'s pilot lines).
    has_pilot: ClassVar[bool] = False
    #: Columns the policy reads beyond the per-input scalars (``drop``, ``task_class``, ...):
    #: ``reference_drop`` (the logged D), ``agreement`` (the a_ℓ list), ``harmed`` (a harm label).
    reads: ClassVar[tuple[str, ...]] = ()
    #: Whether each head-pair draw is decided on its own (τ set per draw), so draws may be decided apart.
    per_draw: ClassVar[bool] = True

    @property
    @abstractmethod
    def name(self) -> str:
        """The policy and its parameters, in one line."""

    @property
    def short(self) -> str | None:
        """The short name of :data:`pagestats.core.registry.POLICIES` (``--policy``, gate.json), or None."""
        return short_name(type(self))

    @property
    def held_out(self) -> bool:
        """Whether the pilot inputs are left out of every evaluated number."""
        return False

    @property
    def fixed_tau(self) -> float | None:
        """τ when it is one number set before any input is read, else None."""
        return None

    @abstractmethod
    def calibrate(self, con, source: str) -> str:
        """SQL of every row of the relation ``source`` on the DuckDB connection ``con`` with
        ``tau`` (DOUBLE, null without a threshold), ``in_pilot`` and ``gate_open`` added; what it
        needs (a pilot, τ per group) is made on ``con`` first. A refused calibration raises ``ValueError``."""

    def record(self, con) -> list[tuple[dict, dict]]:
        """After :meth:`calibrate` on ``con``: per calibration group, its columns and what set its τ,
        in the gate file's words (``pilot`` of :class:`pagestats.deploy.gatefile.Gate`); none by default."""
        return []

    def recalibrated(self, mode: str, **pilot) -> Policy:
        """The policy whose τ is re-derived on a changed statistic (App. A.3.1,
        :func:`pagestats.replay.policies.recalibrate`); only a fixed τ can be."""
        raise ValueError(f"recalibrating ({mode}) applies to a fixed τ; {self.name} "
                         "already derives its threshold from the statistic it gates on")

    def applicable(self, logs):
        """``logs`` restricted to the groups where the policy applies, and the rows (with a ``note``)
        of the groups left out, or None: every group, by default."""
        return logs, None

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The policy's decision on the inputs of ``frame``: ``in_pilot``, ``tau`` and ``gate_open``
        added, row order kept (:meth:`calibrate`, run by :func:`calibration`)."""
        return calibration(self, frame)[0]


def calibration(policy: Policy, frame: pl.DataFrame) -> tuple[pl.DataFrame, list[tuple[dict, dict]]]:
    """``policy.calibrate`` run by DuckDB on ``frame``: the frame with ``in_pilot``, ``tau`` and
    ``gate_open`` added (row order kept), and :meth:`Policy.record` of the same calibration."""
    recorded = []

    def query(con, source):
        decided = policy.calibrate(con, source)
        recorded.extend(policy.record(con))
        return f"SELECT in_pilot, tau, gate_open FROM ({decided}) ORDER BY _row"

    decided = frame_query(frame, query, lists=policy.reads)
    return frame.with_columns(decided["in_pilot"], decided["tau"].cast(pl.Float64), decided["gate_open"]), recorded


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


#: The table by which a connection whose ``drops`` keep one set of inputs from one calibration to the
#: next (blocks of head-pair draws of the same inputs, :func:`pagestats.replay.decisions_by_draw`; the
#: policies of a comparison decided in turn, Table N1) keeps its pilots: per query that drew a pilot
#: into ``_pilot_units``, the table that keeps a copy (:func:`keep_pilots`, :func:`store_calibration`).
KEPT_PILOT = "_kept_pilot"


def keep_pilots(con) -> None:
    """Declare that ``drops`` on ``con`` will keep its inputs: a pilot drawn by a query that drew one
    before is that one, not drawn again."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {KEPT_PILOT} (query VARCHAR, kept VARCHAR)")


def store_calibration(con, source: str, pilot: str, tau: str) -> bool:
    """Materialise the pilot inputs (``_pilot_units``) and the threshold per group (``_pilot_tau``)
    on ``con``: small tables, joined back to every row by :func:`decision_query`. The pilot is kept,
    not drawn again, when :func:`keep_pilots` was declared on ``con`` and the same query drew one.
    Returns whether the pilot was drawn (a caller checks the groups' sizes then)."""
    kept = con.sql("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?", params=[KEPT_PILOT]
                   ).fetchall()[0][0]
    copy = con.sql(f"SELECT kept FROM {KEPT_PILOT} WHERE query = ?", params=[pilot]).fetchall() if kept else []
    if copy:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_units AS SELECT * FROM {copy[0][0]}")
    else:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_units AS {pilot}")
        if kept:
            name = f"{KEPT_PILOT}_{con.sql(f'SELECT count(*) FROM {KEPT_PILOT}').fetchall()[0][0]}"
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM _pilot_units")
            con.execute(f"INSERT INTO {KEPT_PILOT} VALUES (?, ?)", [pilot, name])
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_tau AS {tau}")
    return not copy


def refuse_one_input_pilots(con) -> None:
    """Raise ``ValueError`` if a pilot group of ``_pilot_tau`` has fewer than 2 inputs (σ undefined)."""
    small = con.sql("SELECT * EXCLUDE (tau) FROM _pilot_tau WHERE _n < 2 ORDER BY ALL LIMIT 3").fetchall()
    if small:
        raise ValueError(f"a pilot group has fewer than 2 inputs, σ is undefined: {small}")


def decision_query(source: str, groups, pilot_on) -> str:
    """Every row of ``source`` with the threshold ``tau`` of its group (``groups`` columns of
    ``_pilot_tau``), ``in_pilot`` (its input is a pilot input: ``pilot_on`` columns of
    ``_pilot_units``) and ``gate_open`` (:data:`GATE_RULE`): what :meth:`Policy.calibrate` returns."""
    return (f"SELECT *, {GATE_RULE} AS gate_open FROM (SELECT s.*, t.tau, p._in IS NOT NULL AS in_pilot FROM {source} s "
            f"LEFT JOIN _pilot_tau t ON {join_on(groups, 's', 't')} "
            f"LEFT JOIN (SELECT DISTINCT {quoted(pilot_on)}, true AS _in FROM _pilot_units) p "
            f"ON {join_on(pilot_on, 's', 'p')})")


def standardised(policy, con, source: str, columns, moments: dict[str, str], tau_sql: str):
    """The calibration of :class:`~pagestats.replay.policies.ZScored` and
    :class:`~pagestats.replay.policies.RecalibratedTau`: the pilot of ``policy``
    (``pilot_by``, ``pilot_n``, ``pilot_split``, ``seed``; small groups refused), the pilot moments of
    ``moments`` (prefix → column) per pilot group and head-pair draw, and τ = ``tau_sql`` over
    them; returns what :meth:`Policy.calibrate` returns."""
    by = group_columns(columns, policy.pilot_by, f"{type(policy).__name__}.pilot_by")
    groups = [*by, *draw_columns(columns)]
    stats = pilot_moments(source, "_pilot_units", by, groups, moments)
    if store_calibration(con, source, pilot_query(source, by, policy.pilot_n, policy.pilot_split, policy.seed),
                         f"SELECT *, {tau_sql} AS tau FROM ({stats})"):
        refuse_small_groups(con, source, by, policy.pilot_n, policy.pilot_split)
    refuse_one_input_pilots(con)
    return decision_query(source, groups, [*by, *INPUT_KEY])


def stored_groups(con, group_by, fields: dict[str, str]) -> list[tuple[dict, dict]]:
    """The rows of ``_pilot_tau`` on ``con`` (:meth:`Policy.record`): per group, its ``group_by`` columns
    (with ``pair_draw`` when it has head-pair draws) and ``fields`` (name → column of ``_pilot_tau``)."""
    groups = [*group_by, *draw_columns(relation_columns(con, "_pilot_tau"))]
    cols = ", ".join([*(f'"{c}"' for c in groups), *(f'"{c}" AS "{n}"' for n, c in fields.items())])
    out = []
    for row in con.sql(f"SELECT {cols} FROM _pilot_tau ORDER BY ALL").fetchall():
        out.append((dict(zip(groups, row[:len(groups)])), dict(zip(fields, row[len(groups):]))))
    return out
