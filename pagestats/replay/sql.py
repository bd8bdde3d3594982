"""The replay pushed down to DuckDB: the gate decision per input as a relation that the
aggregates of :mod:`pagestats.whatif` and :func:`pagestats.replay.tau_curve` join to the
outcome rows, so that no per-(input, budget) row is built in Python.

:func:`connect` gives a DuckDB connection on which ``inputs`` and ``outcomes`` name the
logs' tables: the views over the parquet files of a :class:`pagestats.io.LogDB` (out of
core), or in-memory frames registered by reference (zero-copy Arrow). :func:`decide`
then creates the relation ``decisions`` (``run_id, task, input_id, [pair_draw], drop, tau,
gate_open``):

``decide`` also creates ``held_out``: the keys of the inputs a held-out calibration pilot
used to set τ (:class:`~pagestats.replay.policies.ZScored` by default), which no evaluated
number may include; it is empty for a policy without one.

* D is the logged ``drop`` under the default profile (validation checks it against
  :func:`pagestats.profile.drop_from_agreement`; the collector's logs reproduce it bit for
  bit); any other profile spec (layer or head-pair subsets, k, statistics) recomputes it with
  :func:`pagestats.replay.profile_drop` on the per-input frame (only the list columns the spec
  reads) and joins it back as the relation ``drops``;
* a fixed τ, the task-label oracle and the policies that calibrate τ on a pilot (z-scored,
  recalibrated τ, midpoint) decide in SQL over ``drops``, with the policy's own SQL
  (:data:`~pagestats.formulas.GATE_RULE`, :attr:`TaskOracle.rule
  <pagestats.replay.policies.TaskOracle.rule>`, the ``calibrate`` methods of
  :mod:`pagestats.replay.policies`): only the pilot inputs and τ per group are materialised;
* a :class:`~pagestats.replay.policies.CustomPolicy` (a Python callable) runs
  :func:`pagestats.replay.gate` on the per-input frame, and the decisions are joined back.

The per-(input, evictor, budget) rows never leave DuckDB.

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D); App. A.3.4–A.3.5 (the what-ifs).
"""

from __future__ import annotations

from types import SimpleNamespace

import duckdb
import polars as pl

from pagestats.columns import require_columns, with_task_class
from pagestats.io import duck
from pagestats.io.database import is_database
from pagestats.replay.gate import decide_all
from pagestats.formulas import GATE_RULE
from pagestats.replay.policies import (
    FixedTau,
    Midpoint,
    Policy,
    RecalibratedTau,
    TaskOracle,
    ZScored,
    decision_query,
    register_functions,
)
from pagestats.replay.spec import ProfileSpec, profile_drop
from pagestats.schema import INPUT_KEY

#: The scalar columns of ``inputs`` that the replay reads.
INPUT_COLUMNS = (*INPUT_KEY, "model", "context_length", "task_class", "n_tokens", "full_score", "drop")
#: The columns of ``outcomes`` that the replay reads.
OUTCOME_COLUMNS = (*INPUT_KEY, "evictor", "budget", "n_kept", "score")

#: The columns of the relation ``decisions`` made by :func:`decide`.
DECISION_COLUMNS = (*INPUT_KEY, "pair_draw", *INPUT_COLUMNS[3:-1], "drop", "tau", "gate_open")

_KEY = ", ".join(INPUT_KEY)
_META = ", ".join(c for c in INPUT_COLUMNS if c != "drop")
_INPUT_META = ", ".join(c for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop"))


def connect(logs) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection on which ``inputs`` and ``outcomes`` are the logs' tables.

    Parameters
    ----------
    logs : pagestats.io.Logs, pagestats.io.LogDB, or any object with ``inputs`` and
        ``outcomes`` polars frames.

    Notes
    -----
    A :class:`~pagestats.io.LogDB` gives a cursor on its database (views over the parquet
    files, validated when the database was built). In-memory frames are registered by
    reference; their outcome rows are checked for duplicates here, as the metrics check
    their frames.
    """
    if is_database(logs):
        return logs.cursor()
    inputs = with_task_class(logs.inputs)
    require_columns(inputs, INPUT_COLUMNS, "inputs")
    require_columns(logs.outcomes, OUTCOME_COLUMNS, "outcomes")
    outcomes = logs.outcomes.select(OUTCOME_COLUMNS)
    if outcomes.select(pl.struct(*INPUT_KEY, "evictor", "budget").is_duplicated().any()).item():
        raise ValueError("outcomes: duplicate rows for the same (input, evictor, budget)")
    con = duck.connect(threads=1)  # one thread: the same sums, to the last bit, on every call
    # in key order on one thread: every sum adds its terms in one order, so a rerun is bit-identical
    con.register("inputs", inputs.select(*INPUT_COLUMNS, *(["draw"] if "draw" in inputs.columns else []))
                 .sort(INPUT_KEY))
    con.register("outcomes", outcomes.sort(*INPUT_KEY, "evictor", "budget"))
    return con


def _per_input(con, logs, profile: ProfileSpec):
    """The logs as :func:`pagestats.replay.gate` reads them: in-memory logs as they are; for a
    database, the per-input frame with the per-layer lists the spec needs (and ``topk`` for k)."""
    if not is_database(logs):
        return logs
    lists = ["agreement"]
    if profile.pairs_fraction is not None and profile.k is None:
        lists.append("pair_jaccard")
    if profile.is_signal:
        lists.append("signals")
    cols = ", ".join(f'"{c}"' for c in (*INPUT_COLUMNS, *lists))
    inputs = con.sql(f"SELECT {cols} FROM inputs ORDER BY {_KEY}").pl()
    topk = (con.sql(f"SELECT * FROM topk ORDER BY {_KEY}, layer, head").pl()
            if profile.k is not None and logs.has_topk else None)  # without topk: the replay's error
    return SimpleNamespace(inputs=inputs, outcomes=None, topk=topk, manifests=logs.manifests)


def drops(con, logs, profile: ProfileSpec = ProfileSpec()) -> list[str]:
    """Create the relation ``drops`` on ``con`` (the input columns and D under ``profile``, as
    ``decisions`` without τ); return its draw columns.

    The default profile reads the logged D in SQL; any other spec runs
    :func:`pagestats.replay.profile_drop` on the per-input frame and joins D back.
    """
    if not isinstance(profile, ProfileSpec):
        raise TypeError(f"profile must be a ProfileSpec, got {type(profile).__name__}")
    if profile == ProfileSpec():
        con.execute(f'CREATE OR REPLACE TEMP VIEW drops AS SELECT {_META}, "drop" FROM inputs')
        return []
    frame = profile_drop(_per_input(con, logs, profile), profile)
    draws = ["pair_draw"] if "pair_draw" in frame.columns else []
    con.register("_dropped", frame)
    meta = ", ".join(f"i.{c}" for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop"))
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW drops AS SELECT {_KEY}, {'pair_draw, ' if draws else ''}{meta}, "
        f'd."drop" FROM _dropped d JOIN inputs i USING ({_KEY})'
    )
    return draws


def _decided(con, logs, policy: Policy, profile: ProfileSpec) -> tuple[list[str], str]:
    """Create ``_decided`` on ``con``: every row of ``drops`` with ``tau``, ``gate_open`` and
    ``pilot``, decided in SQL; return the draw columns and the SQL condition of a held-out row."""
    draws = drops(con, logs, profile)
    if isinstance(policy, (FixedTau, TaskOracle)):
        if isinstance(policy, FixedTau):
            policy.decide(pl.DataFrame({"drop": [0.0]}))  # the policy's own check of τ
            tau, rule = f"CAST('{float(policy.tau)!r}' AS DOUBLE)", GATE_RULE
        else:
            tau, rule = "CAST(NULL AS DOUBLE)", policy.rule
            if con.sql("SELECT count(*) FROM drops WHERE task_class IS NULL").fetchall()[0][0]:
                raise ValueError("TaskOracle: task_class is null for some inputs")
        con.execute(f"CREATE OR REPLACE TEMP VIEW _decided AS SELECT *, {rule} AS gate_open, false AS pilot "
                    f"FROM (SELECT *, {tau} AS tau FROM drops)")
        return draws, "false"
    source = "drops"
    if isinstance(policy, RecalibratedTau):  # the reference D: the logged one
        con.execute(f"CREATE OR REPLACE TEMP VIEW _gate_source AS SELECT d.*, CAST(i.\"drop\" AS DOUBLE) AS "
                    f"reference_drop FROM drops d JOIN (SELECT {_KEY}, \"drop\" FROM inputs) i USING ({_KEY})")
        source = "_gate_source"
    register_functions(con)
    groups, pilot_on = policy.calibrate(con, source)
    con.execute(f"CREATE OR REPLACE TEMP VIEW _decided AS SELECT *, {GATE_RULE} AS gate_open FROM "
                f"({decision_query(source, groups, pilot_on)})")
    if con.sql("SELECT count(*) FROM _decided WHERE gate_open IS NULL").fetchall()[0][0]:
        raise ValueError(f"policy {policy.name!r} left gate_open undecided for some inputs")
    return draws, "pilot" if policy.held_out else "false"


def decide(con, logs, policy: Policy, profile: ProfileSpec = ProfileSpec()) -> list[str]:
    """Create the relation ``decisions`` on ``con``; return its draw columns (``["pair_draw"]`` or ``[]``).

    ``decisions`` has :data:`DECISION_COLUMNS` (``pair_draw`` only with head-pair draws), one
    row per input (and draw): the input's own columns with its D, τ and decision, so that a
    query joins the outcome rows to it once. See the module docstring for where each policy runs.
    """
    if not isinstance(profile, ProfileSpec):
        raise TypeError(f"profile must be a ProfileSpec, got {type(profile).__name__}")
    if not isinstance(policy, (FixedTau, TaskOracle, ZScored, RecalibratedTau, Midpoint)):
        return _decide_in_python(con, logs, policy, profile)
    draws, held = _decided(con, logs, policy, profile)
    cols = f"{_KEY}, {'pair_draw, ' if draws else ''}{_INPUT_META}, \"drop\", tau, gate_open"
    con.execute(f"CREATE OR REPLACE TEMP VIEW decisions AS SELECT {cols} FROM _decided WHERE NOT ({held})")
    con.execute(f"CREATE OR REPLACE TEMP VIEW held_out AS SELECT DISTINCT {_KEY} FROM _decided WHERE {held}")
    return draws


def _decide_in_python(con, logs, policy: Policy, profile: ProfileSpec) -> list[str]:
    """:func:`decide` for a policy that is Python code (:class:`~pagestats.replay.policies.CustomPolicy`):
    :func:`pagestats.replay.gate` on the per-input frame, joined back."""
    decided = decide_all(_per_input(con, logs, profile), policy, profile)
    held = decided.filter(pl.col("held_out")).select(INPUT_KEY).unique()
    con.register("_held_out", held)
    con.execute("CREATE OR REPLACE TEMP VIEW held_out AS SELECT * FROM _held_out")
    frame = decided.filter(~pl.col("held_out"))
    draws = ["pair_draw"] if "pair_draw" in frame.columns else []
    con.register("_decided", frame.select(*INPUT_KEY, *draws, "drop", "tau", "gate_open"))
    meta = ", ".join(f"i.{c}" for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop"))
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW decisions AS SELECT {_KEY}, {'pair_draw, ' if draws else ''}{meta}, "
        f'd."drop", d.tau, d.gate_open FROM _decided d JOIN inputs i USING ({_KEY})'
    )
    return draws


def pilot_rows(con, logs, policy: Policy, profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """The rows of the calibration pilot of ``policy`` (``model, context_length, run_id, task,
    input_id, [pair_draw], tau``) in input order, decided in SQL; empty for a policy without one."""
    if not isinstance(policy, (ZScored, RecalibratedTau, Midpoint)):
        return con.sql("SELECT model, context_length, run_id, task, input_id, CAST(NULL AS DOUBLE) AS tau "
                       "FROM inputs LIMIT 0").pl()
    draws, _ = _decided(con, logs, policy, profile)
    order = ", ".join([*INPUT_KEY, *draws])
    return con.sql(f"SELECT model, context_length, run_id, task, input_id{', pair_draw' if draws else ''}, tau "
                   f"FROM _decided WHERE pilot ORDER BY {order}").pl()
