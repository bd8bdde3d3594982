"""Gate policies as values: fixed τ, z-scored, midpoint, task-label oracle, custom callable.

A policy turns the per-input frame of the replay (one row per input, or per input and
head-pair draw) into a threshold ``tau`` and a decision ``gate_open``. The gate evicts iff
D ≥ τ (§3 "Algorithm", Eq. 2); every policy that has a threshold applies exactly that rule,
so a policy only has to say how τ is chosen.

Every policy is a frozen dataclass with a ``name`` and a method ``decide(frame)`` that
returns ``frame`` with two columns added: ``tau`` (Float64, null for the oracle and custom
policies, which have no threshold) and ``gate_open`` (Boolean, never null).

The frame given to ``decide`` has the columns ``run_id, task, input_id, [pair_draw], model,
context_length, task_class, n_tokens, full_score, drop``, and for a :class:`CustomPolicy`
also ``agreement`` (the stored a_ℓ list, for a rule that reads the whole profile; the built-in
policies read D only, and their frame leaves the list out, which head-pair draws would repeat
on every draw).

The policies that calibrate τ on a pilot (:class:`ZScored`, :class:`RecalibratedTau`,
:class:`Midpoint`) are written once, as DuckDB SQL: :func:`pilot_query` draws the pilot,
their ``calibrate`` method sets τ per group, :func:`decision_query` joins it back to every row.
``decide(frame)`` runs that SQL on the frame registered in DuckDB, and
:mod:`pagestats.replay.sql` runs it on the logs out of core, so the two paths share one
definition. The pilot hash (:func:`pilot_hash`) is Python, called by DuckDB as a vectorised
function.

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (recipe, Eq. 5; z-scored variant; Table 8);
§4.1 and Table 14 (task-label oracle).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats.columns import with_task_class
from pagestats.io import duck
from pagestats.formulas import GATE_RULE
from pagestats.schema import INPUT_KEY

#: Canonical order of inputs inside a calibration group for ``pilot="first"``: the first
#: inputs of every task in turn (input_id first, task only as a tie-break), so that a pilot
#: of n inputs is a balanced slice of the logged workload rather than n inputs of one task.
PILOT_ORDER = ["input_id", "task", "run_id"]
#: How a pilot is drawn (see :func:`pilot_mask`); ``"held-out"`` also removes the pilot
#: inputs from every evaluated number (:func:`pagestats.replay.gate`).
PILOT_SPLITS = ("first", "random", "held-out")


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def _sql_float(value: float) -> str:
    """``value`` as an exact SQL DOUBLE literal (its shortest round-trip repr)."""
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def _cols(cols, alias: str = "") -> str:
    return ", ".join(f'{alias}"{c}"' for c in cols)


def _on(cols, left: str, right: str) -> str:
    return " AND ".join(f'{left}."{c}" = {right}."{c}"' for c in cols) or "TRUE"


def _columns(con, source: str) -> list[str]:
    return [row[0] for row in con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()]


def _draw_cols(columns) -> list[str]:
    return ["pair_draw"] if "pair_draw" in columns else []


def _check_group_cols(columns, cols, what: str) -> list[str]:
    cols = list(cols)
    missing = [c for c in cols if c not in columns]
    if missing:
        raise ValueError(f"{what}: grouping columns {missing} are not in the gate frame {list(columns)}")
    return cols


# --------------------------------------------------------------------------- the pilot, in SQL

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
    import pyarrow as pa

    return pa.array(pilot_hash(*(a.to_pylist() for a in (seeds, run_ids, tasks, input_ids))), type=pa.int64())


def register_functions(con) -> None:
    """Make :func:`pilot_hash` callable on the DuckDB connection ``con`` (a vectorised Arrow
    UDF, ``pagestats_pilot_hash(seed, run_id, task, input_id)``)."""
    known = con.sql(f"SELECT count(*) FROM duckdb_functions() WHERE function_name = {_sql_string(PILOT_HASH_FUNCTION)}"
                    ).fetchall()[0][0]
    if not known:
        con.create_function(PILOT_HASH_FUNCTION, _pilot_hash_arrow, ["BIGINT", "VARCHAR", "VARCHAR", "BIGINT"],
                            "BIGINT", type="arrow", side_effects=False)


def _check_pilot(n: int, mode: str) -> None:
    if mode not in PILOT_SPLITS:
        raise ValueError(f"pilot split must be one of {PILOT_SPLITS}, got {mode!r}")
    if int(n) != n or n < 1:
        raise ValueError(f"pilot size must be a positive integer, got {n}")


def pilot_query(source: str, by, n: int, mode: str = "first", seed: int = 0) -> str:
    """The calibration pilot of each ``by`` group of the relation ``source``, as DuckDB SQL.

    The query gives the distinct pilot inputs (``by`` columns, ``run_id, task, input_id``):
    per group the first ``n`` inputs in (input_id, task, run_id) order (``"first"``), or the
    ``n`` of smallest :func:`pilot_hash` under ``seed``, ties in that order (``"random"``,
    ``"held-out"``). A group of fewer inputs gives all of them (:func:`refuse_small_groups`
    refuses it). Needs :func:`register_functions` on the connection for a hashed pilot.
    """
    _check_pilot(n, mode)
    by = list(by)
    units = _cols([*by, *INPUT_KEY])
    order = [f"{c} NULLS FIRST" for c in _cols(PILOT_ORDER).split(", ")]
    if mode != "first":
        order.insert(0, f"{PILOT_HASH_FUNCTION}({int(seed)}, run_id, task, input_id)")
    partition = f"PARTITION BY {_cols(by)} " if by else ""
    return (f"SELECT {units} FROM (SELECT DISTINCT {units} FROM {source}) "
            f"QUALIFY row_number() OVER ({partition}ORDER BY {', '.join(order)}) <= {int(n)}")


def refuse_small_groups(con, source: str, by, n: int, mode: str) -> None:
    """Raise ``ValueError`` if a ``by`` group of ``source`` has fewer than ``n`` distinct inputs
    (``n`` + 1 for a held-out pilot, which must leave an input to evaluate)."""
    by = list(by)
    need = n + 1 if mode == "held-out" else n
    units = f"SELECT DISTINCT {_cols([*by, *INPUT_KEY])} FROM {source}"
    if by:
        query = (f"SELECT {_cols(by)}, count(*) AS len FROM ({units}) GROUP BY ALL HAVING count(*) < {int(need)} "
                 f"ORDER BY ALL NULLS FIRST LIMIT 1")
    else:
        query = f"SELECT count(*) AS len FROM ({units}) HAVING count(*) < {int(need)}"
    small = con.sql(query).fetchall()
    if small:
        row = dict(zip([*by, "len"], small[0]))
        group = ", ".join(f"{c}={row[c]}" for c in by) or "all inputs"
        raise ValueError(f"pilot of {n} inputs is larger than the data: {group} has {row['len']} input(s)"
                         + (" and a held-out pilot must leave one to evaluate" if mode == "held-out" else ""))


def _frame_query(frame: pl.DataFrame, query, *, con=None) -> pl.DataFrame:
    """Run ``query(con, source)`` (a function returning SQL over the relation ``source``) on the
    scalar columns of ``frame`` registered in DuckDB, with ``_row`` (the row index) added."""
    scalar = [c for c, t in frame.schema.items() if not t.is_nested()]
    own = con is None
    con = duck.connect(threads=1) if own else con  # one thread: bit-identical reruns
    try:
        register_functions(con)
        con.register("_gate_frame", frame.select(scalar).with_row_index("_row"))
        return con.sql(query(con, "_gate_frame")).pl()
    finally:
        if own:
            con.close()


def pilot_mask(frame: pl.DataFrame, by, n: int, mode: str = "first", seed: int = 0, *,
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
    mode : {"first", "random", "held-out"}
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
    out of the pilot together. It is :func:`pilot_query` run by DuckDB on ``frame``, the
    query that also draws the pilot of the logs out of core (:mod:`pagestats.replay.sql`).
    """
    _check_pilot(n, mode)
    by = _check_group_cols(frame.columns, by, "pilot_mask")
    units = [*by, *INPUT_KEY]

    def query(con, source):
        if strict:
            refuse_small_groups(con, source, by, n, mode)
        return (f"SELECT p._in IS NOT NULL AS pilot FROM {source} s LEFT JOIN "
                f"(SELECT *, true AS _in FROM ({pilot_query(source, by, n, mode, seed)})) p ON {_on(units, 's', 'p')} "
                f"ORDER BY s._row")

    return _frame_query(frame, query)["pilot"]


def _pilot_moments(source: str, pilot: str, by, groups, columns: dict[str, str]) -> str:
    """Per pilot group and head-pair draw, the pilot mean, sample SD (ddof=1) and size of each
    column of ``columns`` (``prefix → column``: ``{prefix}_mu``, ``{prefix}_sigma``, ``_n``;
    App. A.3.4), over the rows of ``source`` whose input is in the table ``pilot``. The values are
    aggregated in input order, so the moments do not depend on the row order of ``source``."""
    order = _cols(INPUT_KEY)
    stats = []
    for prefix, col in columns.items():
        values = f'list("{col}" ORDER BY {order})'
        stats += [f"list_avg({values}) AS {prefix}_mu", f"list_stddev_samp({values}) AS {prefix}_sigma"]
    return (f"SELECT {_cols(groups)}, {', '.join(stats)}, count(*) AS _n FROM {source} s "
            f"SEMI JOIN {pilot} p ON {_on([*by, *INPUT_KEY], 's', 'p')} GROUP BY {_cols(groups)}")


def _calibrate(con, source: str, pilot: str, tau: str) -> None:
    """Materialise the pilot inputs (``_pilot_units``) and the threshold per group
    (``_pilot_tau``) on ``con``: small tables, joined back to every row by :func:`decision_query`."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_units AS {pilot}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_tau AS {tau}")


def _refuse_one_input_pilots(con) -> None:
    small = con.sql("SELECT * EXCLUDE (tau) FROM _pilot_tau WHERE _n < 2 ORDER BY ALL LIMIT 3").fetchall()
    if small:
        raise ValueError(f"a pilot group has fewer than 2 inputs, σ is undefined: {small}")


def decision_query(source: str, groups, pilot_on) -> str:
    """Every row of ``source`` with the threshold ``tau`` of its group (``groups`` columns of
    ``_pilot_tau``) and ``pilot``: whether its input is a pilot input (``pilot_on`` columns of
    ``_pilot_units``), after a policy's ``calibrate``."""
    return (f"SELECT s.*, t.tau, p._in IS NOT NULL AS pilot FROM {source} s "
            f"LEFT JOIN _pilot_tau t ON {_on(groups, 's', 't')} "
            f"LEFT JOIN (SELECT DISTINCT {_cols(pilot_on)}, true AS _in FROM _pilot_units) p ON {_on(pilot_on, 's', 'p')}")


def _decide_in_duckdb(policy, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with ``pilot``, ``tau`` and ``gate_open`` (:data:`GATE_RULE`) added, row order
    kept: ``policy.calibrate`` and :func:`decision_query` run by DuckDB on ``frame``."""

    def query(con, source):
        groups, pilot_on = policy.calibrate(con, source)
        return f"SELECT pilot, tau FROM ({decision_query(source, groups, pilot_on)}) ORDER BY _row"

    decided = _frame_query(frame, query)
    out = frame.with_columns(decided["pilot"], decided["tau"].cast(pl.Float64))
    return out.with_columns(pl.sql_expr(GATE_RULE).alias("gate_open"))


def _with_tau(frame: pl.DataFrame, tau: float) -> pl.DataFrame:
    out = frame.with_columns(pl.lit(float(tau)).cast(pl.Float64).alias("tau"))
    return out.with_columns(pl.sql_expr(GATE_RULE).alias("gate_open"))


@dataclass(frozen=True)
class FixedTau:
    """One global threshold: open iff D ≥ τ (§3 "Calibration"; τ = 0.07, Table 8)."""

    #: What the policy needs besides D (Table 8), and where the report applies it.
    labels: ClassVar[str] = "none: τ is a constant"
    used_in: ClassVar[str] = "every table and figure (the report's policy by default)"

    tau: float = defaults.TAU

    @property
    def name(self) -> str:
        return f"fixed(tau={self.tau!r})"

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        if not isinstance(self.tau, (int, float)) or np.isnan(self.tau):
            raise ValueError(f"FixedTau.tau must be a number, got {self.tau!r}")
        return _with_tau(frame, self.tau)


def _standardised(policy, con, source: str, columns, moments: dict[str, str], tau_sql: str):
    """The calibration of :class:`ZScored` and :class:`RecalibratedTau`: the pilot of ``policy``
    (``pilot_by``, ``pilot_n``, ``pilot``, ``seed``; small groups refused), the pilot moments of
    ``moments`` (prefix → column) per pilot group and head-pair draw, and τ = ``tau_sql`` over
    them; returns what :meth:`ZScored.calibrate` returns."""
    by = _check_group_cols(columns, policy.pilot_by, f"{type(policy).__name__}.pilot_by")
    groups = [*by, *_draw_cols(columns)]
    refuse_small_groups(con, source, by, policy.pilot_n, policy.pilot)
    stats = _pilot_moments(source, "_pilot_units", by, groups, moments)
    _calibrate(con, source, pilot_query(source, by, policy.pilot_n, policy.pilot, policy.seed),
               f"SELECT *, {tau_sql} AS tau FROM ({stats})")
    _refuse_one_input_pilots(con)
    return groups, [*by, *INPUT_KEY]


@dataclass(frozen=True)
class ZScored:
    """Per-model standardised threshold τ_M = μ_M + θ_z σ_M (App. A.3.4, "Architecture-normalized
    variant": z(x) = (D(x) − μ_M)/σ_M ≥ θ_z, θ_z = −0.69).

    Parameters
    ----------
    theta_z : float
        Global threshold on the z-scored drop.
    pilot_n : int
        Unlabelled pilot size per group (the paper: "∼100 inputs"); a group with fewer
        inputs is refused (with ``"held-out"``, fewer than ``pilot_n + 1``).
    pilot_by : tuple of str
        Pilot groups: ``("model",)`` pools all contexts of a model, as the paper's
        per-model μ_M, σ_M; ``("model", "context_length")`` calibrates each cell.
    pilot : {"held-out", "random", "first"}
        Which inputs form the pilot; see :func:`pilot_mask`. The default ``"held-out"``
        draws them by a seeded hash of the input identity and leaves them out of every
        evaluated number, so the gate is never scored on the inputs that set it.
    seed : int
        Seed of the pilot hash.

    Notes
    -----
    The paper leaves the pilot definition open (§4.1: the Llama MK3 call "flips under three
    of four plausible definitions of the unlabeled pilot"), so it is pinned here: the pilot
    is drawn from the logged inputs of the group (no labels are read), μ is the pilot mean
    and σ the pilot sample standard deviation with ``ddof=1`` (an estimate of the model's
    population σ from a sample). With head-pair draws μ and σ are computed per draw from
    the same pilot inputs. Example of App. A.3.4 (Qwen3-4B): μ = 0.034, σ = 0.017 →
    τ = 0.034 − 0.69·0.017 = 0.02227 ≈ 0.022.
    """

    labels: ClassVar[str] = "none: an unlabeled pilot of each model's inputs gives μ_M and σ_M"
    used_in: ClassVar[str] = "Table N1 (pilot sensitivity); whatif --policy z"

    theta_z: float = defaults.THETA_Z
    pilot_n: int = defaults.PILOT_N
    pilot_by: tuple[str, ...] = ("model",)
    pilot: str = defaults.PILOT_SPLIT
    seed: int = 0

    @property
    def name(self) -> str:
        return f"z(theta={self.theta_z!r}, pilot={self.pilot}:{self.pilot_n}, by={','.join(self.pilot_by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot == "held-out"

    def calibrate(self, con, source: str) -> tuple[list[str], list[str]]:
        """Draw the pilot of the relation ``source`` on the DuckDB connection ``con`` and set
        τ = μ + θ_z σ per pilot group and head-pair draw (``_pilot_units``, ``_pilot_tau``);
        return the columns that join τ and pilot membership back to a row (:func:`decision_query`)."""
        return _standardised(self, con, source, _columns(con, source), {"_z": "drop"},
                             f"_z_mu + {_sql_float(self.theta_z)} * _z_sigma")

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        return _decide_in_duckdb(self, frame)


@dataclass(frozen=True)
class RecalibratedTau:
    """A fixed threshold carried onto a changed statistic by standardisation (App. A.3.1:
    "any sweep of a parameter that rescales D must recalibrate τ alongside it").

    τ keeps its position in the pilot's distribution of the reference D: per pilot group,
    θ = (τ − μ_ref)/σ_ref on the logged D (``reference_drop``, the default profile), and
    the threshold on the changed statistic is τ' = μ' + θ·σ' over the same pilot inputs
    (the z-scored rule of App. A.3.4 with θ_z = θ). On an unchanged statistic τ' = τ.

    Parameters
    ----------
    tau : float
        The threshold on the reference D (the paper: 0.07).
    pilot_n, pilot_by, pilot, seed
        The pilot, as for :class:`ZScored` (the same rule; ``"held-out"`` by default).
    """

    labels: ClassVar[str] = "none: τ keeps its z-position in an unlabeled pilot of the reference D"
    used_in: ClassVar[str] = "whatif --recalibrate; the k, layer and head-pair sweeps (Tables 9, 10, App. A.3.1)"

    tau: float = defaults.TAU
    pilot_n: int = defaults.PILOT_N
    pilot_by: tuple[str, ...] = ("model",)
    pilot: str = defaults.PILOT_SPLIT
    seed: int = 0

    @property
    def name(self) -> str:
        return f"recalibrated(tau={self.tau!r}, pilot={self.pilot}:{self.pilot_n}, by={','.join(self.pilot_by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot == "held-out"

    def calibrate(self, con, source: str) -> tuple[list[str], list[str]]:
        """As :meth:`ZScored.calibrate`, with τ' = μ' + θ σ', θ = (τ − μ_ref)/σ_ref per pilot group
        and head-pair draw (``reference_drop`` is the reference D, ``drop`` the changed one)."""
        columns = _columns(con, source)
        if "reference_drop" not in columns:
            raise ValueError("RecalibratedTau needs the reference D (reference_drop) in the gate frame")
        theta = f"(({_sql_float(self.tau)} - _r_mu) / _r_sigma)"
        return _standardised(self, con, source, columns, {"_r": "reference_drop", "_c": "drop"},
                             f"_c_mu + {theta} * _c_sigma")

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        return _decide_in_duckdb(self, frame)


@dataclass(frozen=True)
class Midpoint:
    """The 40-input recipe, Eq. 5: τ = (D̄_C + D̄_D)/2 per calibration group (App. A.3.4).

    Parameters
    ----------
    n : int
        Inputs per class (the paper: 20 NIAH-MK3 + 20 VT).
    by : tuple of str
        Calibration groups; ``("model", "context_length")`` = "for a new (model, context)".
    capacity_tasks, dilution_tasks : tuple of str or None
        Tasks that supply the capacity-bound and dilution-prone samples; by default the
        paper's, ``("niah_multikey_3",)`` and ``("vt",)`` (App. A.3.4: "20 inputs from a known
        capacity-bound task (NIAH-MK3)" and 20 from VT; :data:`pagestats.defaults.MIDPOINT_TASKS`).
        ``None`` for both pools by the ``task_class`` column instead: capacity-bound inputs vs
        dilution-prone inputs of any task.
    pilot : {"first", "random"}
        Which n inputs of each class; see :func:`pilot_mask`.
    seed : int

    Notes
    -----
    Accuracy-label-free but not task-label-free (Table 8). With head-pair draws the class
    means are computed per draw. The recipe is defined on ``n`` inputs of each class
    ("Pick 20 inputs from a known capacity-bound task …", App. A.3.4; Table 7: N = 20), so a
    group with fewer than ``n`` inputs of either class is refused rather than calibrated on
    what it has (:meth:`shortfall` names such groups).
    """

    labels: ClassVar[str] = ("task labels of the pilot (20 inputs of a known capacity-bound task, 20 of a "
                             "dilution-prone one); no accuracy labels")
    used_in: ClassVar[str] = "Tables 7 and 20; whatif --policy midpoint"

    n: int = defaults.MIDPOINT_N
    by: tuple[str, ...] = ("model", "context_length")
    capacity_tasks: tuple[str, ...] | None = defaults.MIDPOINT_TASKS[:1]
    dilution_tasks: tuple[str, ...] | None = defaults.MIDPOINT_TASKS[1:]
    pilot: str = "first"
    seed: int = 0

    @property
    def name(self) -> str:
        samples = ("by class" if self.capacity_tasks is None and self.dilution_tasks is None else
                   f"{'+'.join(self.capacity_tasks or ('class',))} vs {'+'.join(self.dilution_tasks or ('class',))}")
        return f"midpoint(n={self.n}, {samples}, by={','.join(self.by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot == "held-out"

    def _class_sql(self, tasks, klass: str) -> str:
        if tasks is not None:
            return f"task IN ({', '.join(map(_sql_string, tasks))})" if tasks else "FALSE"
        return f"task_class = {_sql_string(klass)}"

    def _classes(self):
        return (("c", self.capacity_tasks, defaults.CAPACITY_BOUND),
                ("d", self.dilution_tasks, defaults.DILUTION_PRONE))

    def shortfall_query(self, source: str, by) -> str:
        """:meth:`shortfall` as DuckDB SQL over the relation ``source``."""
        by = list(by)
        lead = f"{_cols(by)}, " if by else ""
        (_, cap_tasks, cap_class), (_, dil_tasks, dil_class) = self._classes()
        cap = "capacity-bound" + (f" ({', '.join(self.capacity_tasks)})" if self.capacity_tasks else "")
        dil = "dilution-prone" + (f" ({', '.join(self.dilution_tasks)})" if self.dilution_tasks else "")
        text = f"the midpoint recipe (Eq. 5) takes {self.n} {cap} and {self.n} {dil} inputs; this cell has "
        n = int(self.n)
        return f"""
            SELECT {lead}n_capacity, n_dilution,
                CASE WHEN n_capacity < {n} OR n_dilution < {n} THEN {_sql_string(text)} || CAST(n_capacity AS VARCHAR)
                    || ' and ' || CAST(n_dilution AS VARCHAR) END AS note
            FROM (
                SELECT {lead}CAST(coalesce(sum(CAST(_cap AS BIGINT)), 0) AS BIGINT) AS n_capacity,
                    CAST(coalesce(sum(CAST(_dil AS BIGINT)), 0) AS BIGINT) AS n_dilution
                FROM (SELECT DISTINCT {_cols([*by, *INPUT_KEY])}, {self._class_sql(cap_tasks, cap_class)} AS _cap,
                        {self._class_sql(dil_tasks, dil_class)} AS _dil FROM {source})
                GROUP BY ALL
            ){f" ORDER BY {', '.join(f'{c} NULLS FIRST' for c in _cols(by).split(', '))}" if by else ""}"""

    def shortfall(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Per calibration group of ``frame`` (gate or inputs rows), the distinct inputs of each
        class and ``note``: null where the recipe applies, else why not (fewer than ``n``
        inputs of a class, Eq. 5).

        Returns
        -------
        polars.DataFrame
            ``by`` columns, ``n_capacity``, ``n_dilution``, ``note``.
        """
        by = _check_group_cols(frame.columns, self.by, "Midpoint.by")
        return _frame_query(frame, lambda con, source: self.shortfall_query(source, by))

    def applicable(self, logs):
        """``logs`` (a :class:`pagestats.io.Logs` or another dataclass with ``inputs``,
        ``outcomes`` and ``topk``) restricted to the calibration groups where the recipe
        applies, and the :meth:`shortfall` rows (with their ``note``) of the groups left out."""
        short = self.shortfall(with_task_class(logs.inputs))
        kept = logs.inputs.join(short.filter(pl.col("note").is_null()).select(self.by), on=list(self.by), how="semi",
                                nulls_equal=True)
        keys = kept.select(INPUT_KEY)
        topk = getattr(logs, "topk", None)
        sub = dataclasses.replace(logs, inputs=kept, outcomes=logs.outcomes.join(keys, on=INPUT_KEY, how="semi"),
                                  **({} if topk is None else {"topk": topk.join(keys, on=INPUT_KEY, how="semi")}))
        return sub, short.filter(pl.col("note").is_not_null())

    def calibrate(self, con, source: str) -> tuple[list[str], list[str]]:
        """Refuse a group short of ``n`` inputs of a class (:meth:`shortfall`), draw the pilot of
        each class of the relation ``source`` on the DuckDB connection ``con`` and set
        τ = (D̄_C + D̄_D)/2 per group and head-pair draw (``_pilot_units``, ``_pilot_tau``);
        return the columns that join τ and pilot membership back to a row (:func:`decision_query`)."""
        columns = _columns(con, source)
        by = _check_group_cols(columns, self.by, "Midpoint.by")
        short = con.sql(f"SELECT * FROM ({self.shortfall_query(source, by)}) WHERE note IS NOT NULL").fetchall()
        if short:
            row = dict(zip([*by, "n_capacity", "n_dilution", "note"], short[0]))
            cell = ", ".join(f"{c}={row[c]}" for c in by)
            more = f" (and {len(short) - 1} more)" if len(short) > 1 else ""
            raise ValueError(f"{row['note']} ({cell}){more}")
        groups = [*by, *_draw_cols(columns)]
        pilots, means = [], []
        for label, tasks, klass in self._classes():
            part = f"(SELECT * FROM {source} WHERE {self._class_sql(tasks, klass)})"
            pilots.append(f"SELECT '{label}' AS _class, * FROM ({pilot_query(part, by, self.n, self.pilot, self.seed)})")
            means.append(f'SELECT {_cols(groups)}, list_avg(list("drop" ORDER BY {_cols(INPUT_KEY)})) AS _mean_{label} '
                         f"FROM {part} s SEMI JOIN (SELECT * FROM _pilot_units WHERE _class = '{label}') p "
                         f"ON {_on([*by, *INPUT_KEY], 's', 'p')} GROUP BY {_cols(groups)}")
        tau = (f"SELECT *, (_mean_c + _mean_d) / 2 AS tau FROM ({means[0]}) FULL JOIN ({means[1]}) "
               f"USING ({_cols(groups)})")
        _calibrate(con, source, " UNION ALL ".join(f"({p})" for p in pilots), tau)
        return groups, list(INPUT_KEY)

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        return _decide_in_duckdb(self, frame)


@dataclass(frozen=True)
class TaskOracle:
    """Task-label oracle (§4.1, Table 14): closed on capacity-bound task inputs, open elsewhere.

    It reads the ``task_class`` column (task → class mapping from the logs), not D; ``tau``
    is null.
    """

    labels: ClassVar[str] = "the task class of every input (not D)"
    used_in: ClassVar[str] = "Table 14 (the gate against the task-label oracle); whatif --policy oracle"

    capacity_class: str = defaults.CAPACITY_BOUND

    @property
    def name(self) -> str:
        return "oracle(task-label)"

    @property
    def rule(self) -> str:
        """The decision as SQL (evaluated by polars here and by DuckDB in :mod:`pagestats.replay.sql`,
        as the formulas of :mod:`pagestats.formulas`)."""
        return f"task_class <> {_sql_string(self.capacity_class)}"

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        if frame["task_class"].null_count():
            raise ValueError("TaskOracle: task_class is null for some inputs")
        return frame.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("tau"), pl.sql_expr(self.rule).alias("gate_open")
        )


@dataclass(frozen=True)
class CustomPolicy:
    """Any decision computed from the stored profile: ``fn(frame) -> bool array``, open where True.

    ``fn`` receives the gate frame (per-input ``drop`` and the profile columns listed in the
    module docstring) and must return one boolean per row, in row order. ``tau`` is null.
    """

    fn: Callable[[pl.DataFrame], object] = field(compare=False)
    name: str = "custom"

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        result = self.fn(frame)
        if isinstance(result, pl.Series):
            result = result.to_numpy()
        arr = np.asarray(result)
        if arr.shape != (frame.height,):
            raise ValueError(f"CustomPolicy {self.name!r}: fn returned shape {arr.shape}, expected ({frame.height},)")
        if arr.dtype != bool:
            raise TypeError(f"CustomPolicy {self.name!r}: fn must return booleans, got dtype {arr.dtype}")
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("tau"), pl.Series("gate_open", arr))


Policy = FixedTau | ZScored | RecalibratedTau | Midpoint | TaskOracle | CustomPolicy
POLICY_TYPES = (FixedTau, ZScored, RecalibratedTau, Midpoint, TaskOracle, CustomPolicy)

#: ``--recalibrate`` modes: keep τ, carry it by standardisation, or re-derive it with Eq. 5.
RECALIBRATE_MODES = ("none", "z", "midpoint")


def recalibrate(policy: Policy, mode: str, *, pilot_n: int = defaults.PILOT_N, pilot_by=("model",),
                pilot: str = defaults.PILOT_SPLIT, seed: int = 0) -> Policy:
    """The policy whose threshold is re-derived on a changed statistic (App. A.3.1).

    ``"none"`` returns ``policy`` unchanged; ``"z"`` turns a :class:`FixedTau` into a
    :class:`RecalibratedTau` (τ keeps its z-position in the pilot); ``"midpoint"`` replaces
    it by :class:`Midpoint` (Eq. 5 on the changed statistic, per (model, context)). Only a
    fixed threshold can be recalibrated: :class:`ZScored` and :class:`Midpoint` already
    derive τ from the statistic they gate on, and the oracle and custom policies have none.
    """
    if mode not in RECALIBRATE_MODES:
        raise ValueError(f"the recalibration mode must be one of {RECALIBRATE_MODES}, got {mode!r}")
    if mode == "none":
        return policy
    if not isinstance(policy, FixedTau):
        raise ValueError(f"recalibrating ({mode}) applies to a fixed τ; {getattr(policy, 'name', policy)} "
                         "already derives its threshold from the statistic it gates on")
    if mode == "z":
        return RecalibratedTau(tau=policy.tau, pilot_n=pilot_n, pilot_by=tuple(pilot_by), pilot=pilot, seed=seed)
    return Midpoint()
