"""The replay's DuckDB relations, on the connection of a :class:`pagestats.replay.Replay` whose
``inputs`` and ``outcomes`` are the logs' tables: D (``drops``), every policy's decision in SQL
(``_calibrated``, ``decisions``, ``held_out``) and the gated outcomes (:func:`gated_query`), so that no
per-(input, budget) row is built in Python.

D is the logged ``drop`` under the default profile (validation checks it against
:func:`pagestats.core.profile.drop_from_agreement`); any other profile spec recomputes it in NumPy
(:func:`pagestats.replay.profile_drop`) and joins it back (:func:`register_drops`). A held-out
pilot's inputs set τ and are left out of every evaluated number (``held_out``).

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D); App. A.3.4–A.3.5 (the what-ifs).
"""

from __future__ import annotations

import polars as pl

from pagestats.core.formulas import N_KEPT_GATED, SCORE_GATED
from pagestats.io.logs import INPUT_COLUMNS
from pagestats.replay.pilot import register_functions
from pagestats.replay.policies import Policy
from pagestats.replay.spec import ProfileSpec
from pagestats.replay.sqltext import relation_columns
from pagestats.core.schema import INPUT_KEY

#: The columns of the relation ``decisions`` (:func:`create_decisions`).
DECISION_COLUMNS = (*INPUT_KEY, "pair_draw", *INPUT_COLUMNS[3:-1], "drop", "tau", "gate_open")

_KEY = ", ".join(INPUT_KEY)
_META = ", ".join(c for c in INPUT_COLUMNS if c != "drop")
_INPUT_META = ", ".join(c for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop"))


def profile_lists(profile: ProfileSpec) -> list[str]:
    """The list (or struct) columns :func:`pagestats.replay.profile_drop` reads under ``profile``:
    ``pair_jaccard`` for a head-pair subsample unless k recomputes the pairs from ``topk``."""
    lists = ["agreement"]
    if profile.pairs_fraction is not None and profile.k is None:
        lists.append("pair_jaccard")
    if profile.is_signal:
        lists.append("signals")
    return lists


def logged_drops(con) -> list[str]:
    """Create the relation ``drops`` on ``con``: the input columns and the logged D (the default
    profile), as ``decisions`` without τ; return its draw columns (none)."""
    con.execute(f'CREATE OR REPLACE TEMP VIEW drops AS SELECT {_META}, "drop" FROM inputs')
    return []


def register_drops(con, frame: pl.DataFrame) -> list[str]:
    """Create the relation ``drops`` on ``con`` from ``frame`` (D per input and head-pair draw, and any
    other column after D: the logged D as ``reference_drop``, the a_ℓ list a Python policy reads) with
    the input columns, joined from ``inputs`` where ``frame`` does not carry them; return its draw
    columns (``["pair_draw"]`` or ``[]``)."""
    draw_columns = ["pair_draw"] if "pair_draw" in frame.columns else []
    con.register("_dropped", frame)
    meta = [c for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop")]
    carried = [c for c in meta if c in frame.columns]
    join = f" JOIN inputs i USING ({_KEY})" if len(carried) < len(meta) else ""
    cols = ", ".join(f"{'d' if c in carried else 'i'}.{c}" for c in meta)
    own = ", ".join([*INPUT_KEY, *draw_columns, *carried])
    con.execute(f"CREATE OR REPLACE TEMP VIEW drops AS SELECT {_KEY}, {'pair_draw, ' if draw_columns else ''}{cols}, "
                f"d.* EXCLUDE ({own}) FROM _dropped d{join}")
    return draw_columns


def create_calibrated(con, policy: Policy) -> str:
    """Create ``_calibrated`` on ``con``: every row of ``drops`` with ``tau``, ``gate_open`` and
    ``in_pilot`` (``policy.calibrate``); return the SQL condition of a held-out row."""
    source = "drops"
    if "reference_drop" in policy.reads and "reference_drop" not in relation_columns(con, source):  # the logged D
        con.execute(f"CREATE OR REPLACE TEMP VIEW _gate_source AS SELECT d.*, CAST(i.\"drop\" AS DOUBLE) AS "
                    f"reference_drop FROM drops d JOIN (SELECT {_KEY}, \"drop\" FROM inputs) i USING ({_KEY})")
        source = "_gate_source"
    register_functions(con)
    con.execute(f"CREATE OR REPLACE TEMP VIEW _calibrated AS {policy.calibrate(con, source)}")
    # an input without D is the session's refusal (its own line); any other undecided input, the policy's fault
    if con.sql('SELECT count(*) FROM _calibrated WHERE gate_open IS NULL AND "drop" IS NOT NULL').fetchall()[0][0]:
        raise ValueError(f"policy {policy.name!r} left gate_open undecided for some inputs")
    return "in_pilot" if policy.held_out else "false"


def create_decisions(con, draw_columns: list[str], held: str) -> None:
    """Create ``decisions`` (:data:`DECISION_COLUMNS`, one row per evaluated input and draw) and
    ``held_out`` (the keys of the held-out pilot) on ``con`` from ``_calibrated``; ``held`` is the
    condition of a held-out row (:func:`create_calibrated`)."""
    cols = f"{_KEY}, {'pair_draw, ' if draw_columns else ''}{_INPUT_META}, \"drop\", tau, gate_open"
    con.execute(f"CREATE OR REPLACE TEMP VIEW decisions AS SELECT {cols} FROM _calibrated WHERE NOT ({held})")
    con.execute(f"CREATE OR REPLACE TEMP VIEW held_out AS SELECT DISTINCT {_KEY} FROM _calibrated WHERE {held}")


def gated_query(draw_columns: list[str], *, outcomes: str = "outcomes", decisions: str = "decisions",
                held_out: str = "held_out") -> str:
    """The gated outcomes (Eq. 2) as SQL: every outcome row of an evaluated input with its input's
    decision and the gated arm, in :data:`pagestats.replay.GATED_OUTCOME_COLUMNS`. An outcome row
    without an input row keeps a null ``model`` (the readers refuse it)."""
    draw = "".join(f"d.{c}, " for c in draw_columns)
    held = " AND ".join(f"h.{c} = o.{c}" for c in INPUT_KEY)
    return f"""
        SELECT o.run_id, o.task, o.input_id, {draw}d.model, d.context_length, d.task_class, o.evictor, o.budget,
            d.n_tokens, d."drop", d.tau, d.gate_open, d.full_score AS score_full, o.score AS score_plain,
            {SCORE_GATED} AS score_gated, o.n_kept AS n_kept_plain, {N_KEPT_GATED} AS n_kept_gated
        FROM {outcomes} o LEFT JOIN {decisions} d USING ({_KEY})
        WHERE NOT EXISTS (SELECT 1 FROM {held_out} h WHERE {held})"""


def decision_frame(con, draw_columns: list[str], held: str) -> pl.DataFrame:
    """Every row of ``_calibrated``, a held-out pilot included, with :data:`DECISION_COLUMNS` and
    ``held_out`` (``held``: the condition of a held-out row), in input (and draw) order."""
    cols = f"{_KEY}, {'pair_draw, ' if draw_columns else ''}{_INPUT_META}, \"drop\", tau, gate_open"
    order = ", ".join([*INPUT_KEY, *draw_columns])
    return con.sql(f"SELECT {cols}, {held} AS held_out FROM _calibrated ORDER BY {order}").pl()


def pilot_rows(con, draw_columns: list[str]) -> pl.DataFrame:
    """The rows of the calibration pilot in ``_calibrated`` (``model, context_length, run_id, task,
    input_id, [pair_draw], tau``) in input order."""
    order = ", ".join([*INPUT_KEY, *draw_columns])
    return con.sql(f"SELECT model, context_length, run_id, task, input_id{', pair_draw' if draw_columns else ''}, tau "
                   f"FROM _calibrated WHERE in_pilot ORDER BY {order}").pl()


def no_pilot_rows(con) -> pl.DataFrame:
    """:func:`pilot_rows` of a policy without a pilot: no rows, the same columns."""
    return con.sql("SELECT model, context_length, run_id, task, input_id, CAST(NULL AS DOUBLE) AS tau "
                   "FROM inputs LIMIT 0").pl()
