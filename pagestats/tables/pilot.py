"""A table the paper lacks: the sensitivity of the z-scored gate's call on a task to the
definition of its unlabelled pilot (App. A.3.4, §4.1).

It replays the logs (:mod:`pagestats.replay`) under every pilot definition, so it takes
:class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults, formulas
from pagestats.core.columns import MODEL_CELL
from pagestats.core.schema import INPUT_KEY
from pagestats.metrics.engine import names
from pagestats.replay import relations
from pagestats.replay.calibration import keep_pilots
from pagestats.replay.pilot import PILOT_SPLITS, pilot_need
from pagestats.replay.policies import ZScored
from pagestats.replay.sqltext import join_on, sql_string
from pagestats.tables._common import inputs_per, logged_evictor

__all__ = ["pilot_sensitivity_table"]


def _pilot_label(by: Sequence[str]) -> str:
    return "×".join(by)


def _pilot_fits(logs, pilot_by: Sequence[str], pilot_n: int, split: str) -> bool:
    """Whether every pilot group of the logs has the inputs a pilot of ``pilot_n`` needs (one more
    for a held-out pilot, which must leave an input to evaluate)."""
    return bool((inputs_per(logs, pilot_by)["n"] >= pilot_need(pilot_n, split)).all())


def pilot_sensitivity_table(logs, *, pilot_splits: Sequence[str] = PILOT_SPLITS,
                            pilot_by: Sequence[Sequence[str]] = (("model",), ("model", "context_length")),
                            pilot_sizes: Sequence[int] = defaults.PILOT_SIZES, theta_z: float = defaults.THETA_Z,
                            seed: int = 0, evictor: str | None = None,
                            reference: ZScored | None = None,
                            profile: replay.ProfileSpec = replay.ProfileSpec()) -> pl.DataFrame:
    """NEW (not in the paper): sensitivity of the z-scored gate to the pilot definition.

    The paper leaves the unlabelled pilot of the z-scored gate (App. A.3.4) undefined and
    notes (§4.1) that its Llama NIAH-MK3 call "flips under three of four plausible
    definitions of the unlabeled pilot". This table replays every definition — pilot split
    ``"first"`` vs ``"random"`` vs ``"held-out"`` (:func:`pagestats.replay.pilot_mask`) ×
    pooled per model vs per (model, context) × pilot sizes — and reports, per cell and task,
    τ, the gate-open fraction, the gate's *call* on the task (closed iff fewer than half of
    its inputs open) and whether that call flips relative to the ``reference`` definition
    (default :class:`~pagestats.replay.policies.ZScored` with the library defaults: a
    held-out pilot of 100 inputs per model). A definition whose pilot is larger than one of
    its groups (for ``"held-out"``: not smaller) is left out.

    Every definition is evaluated on the same inputs: those that no held-out pilot of the
    table (nor the reference's) takes (:func:`pagestats.metrics.same_inputs`), so that a
    flipped call is never a difference of inputs; ``n_left_out`` counts, per definition, cell
    and task, the inputs it could have evaluated but that another definition's held-out
    pilot takes; a task all of whose inputs some held-out pilot takes keeps its row, with
    ``n_evaluated`` 0 and null rates.

    Returns
    -------
    polars.DataFrame
        ``pilot_split, pilot_by, pilot_n, model, context_length, task, task_class, evictor, tau``,
        ``n_evaluated`` (inputs of the task evaluated, the same for every definition),
        ``n_left_out``, ``p_open`` (of the evaluated inputs), ``closed_call``, ``flips`` (call
        differs from the reference), ``n_flipping_definitions`` (over all definitions, per
        cell and task), ``delta_task`` and ``delta_cell`` (Δ of the headline evictor,
        :func:`pagestats.metrics.delta`).
    """
    reference = reference if reference is not None else ZScored(theta_z=theta_z)
    by_task = [*MODEL_CELL, "task", "task_class"]
    ev = logged_evictor(logs, evictor)
    definitions = []
    for split in pilot_splits:
        for grp in pilot_by:
            for n in pilot_sizes:
                if not _pilot_fits(logs, grp, int(n), split):
                    continue
                definitions.append((split, _pilot_label(grp), int(n),
                                    ZScored(theta_z=theta_z, pilot_n=int(n), pilot_by=tuple(grp), pilot_split=split, seed=seed)))
    if not definitions:
        raise ValueError("pilot_sensitivity_table: no pilot definition fits the logs")
    policies = [reference, *(policy for *_, policy in definitions)]
    first = next((p for p in policies if "agreement" in p.reads), policies[0])  # D carries the a_ℓ list if read
    with replay.Replay(logs, first, profile) as session:
        summaries = _summaries(session, policies, ev, by_task)
    ref = summaries[0].select(*by_task, pl.col("closed_call").alias("_ref"))
    parts = [
        part.with_columns(pl.lit(split).alias("pilot_split"), pl.lit(label).alias("pilot_by"),
                          pl.lit(n, pl.Int64).alias("pilot_n"))
        for (split, label, n, _), part in zip(definitions, summaries[1:])
    ]
    out = pl.concat(parts).join(ref, on=by_task, how="left")
    out = out.with_columns((pl.col("closed_call") != pl.col("_ref")).alias("flips"))
    out = out.with_columns(pl.col("flips").sum().over(by_task).cast(pl.Int64).alias("n_flipping_definitions"))
    return logs.typed_names(out.select(
        "pilot_split", "pilot_by", "pilot_n", *by_task, "evictor", "tau", "n_evaluated", "n_left_out", "p_open",
        "closed_call", "flips", "n_flipping_definitions", "delta_task", "delta_cell").sort(
            ["pilot_split", "pilot_by", "pilot_n", *by_task]))


def _summaries(session: replay.Replay, policies, ev: str, by_task: list[str]) -> list[pl.DataFrame]:
    """Per policy, its (cell, task) rows of the table: τ, the inputs left out, p_open, the call and Δ,
    each policy decided on the session's D in turn and its gated rows (Eq. 2) left in SQL.

    Two passes over the policies: the first keeps each one's held-out pilot (a few rows per group), so
    that the second evaluates every policy on the inputs none of them holds out (the common inputs,
    the rule of :func:`pagestats.metrics.same_inputs`). Each pilot is drawn once
    (:func:`pagestats.replay.calibration.keep_pilots`: the second pass finds the first's), and the
    evictor's outcome rows are checked for a repeated key once: each policy's gated rows join them to
    one decision per input (:func:`pagestats.metrics.engine.known_unique`)."""
    con = session.con
    key = names(INPUT_KEY)
    keep_pilots(con)
    con.execute(f"CREATE OR REPLACE TEMP VIEW _evictor_outcomes AS SELECT * FROM outcomes WHERE evictor = {sql_string(ev)}")
    metrics.engine.refuse_repeats(con.view("_evictor_outcomes"), [*INPUT_KEY, "evictor", "budget"],
                                  "pilot_sensitivity_table")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _held_by AS SELECT 0 AS definition, {key} FROM inputs LIMIT 0")
    for i, policy in enumerate(policies):
        draw_columns = session.decide(policy)
        con.execute(f"INSERT INTO _held_by SELECT {i}, {key} FROM held_out")
    # the inputs of the evictor's outcomes, and those of them that some pilot holds out: left out of every
    # policy's numbers
    con.execute(f"CREATE OR REPLACE TEMP TABLE _logged AS SELECT DISTINCT {key} FROM _evictor_outcomes")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _left_out AS SELECT DISTINCT {key}, i.model, i.context_length "
                f"FROM _held_by h JOIN inputs i USING ({key}) SEMI JOIN _logged o USING ({key})")
    cell = names(MODEL_CELL)
    out = []
    for policy in policies:
        session.decide(policy)
        # over the policy's own evaluated rows, in one scan: its (cell, task) rows and τ per cell (each input's
        # τ on each of its outcome rows, as formulas.group_tau reads them), τ the definition's, set on its pilot
        own = con.sql(relations.gated_query(draw_columns, outcomes="_evictor_outcomes"))
        tau, tasks = metrics.engine.by_groupings(own, [list(MODEL_CELL), by_task], f"{formulas.group_tau()} AS tau")
        tasks = tasks.select(by_task)
        left = con.sql(f"SELECT {cell}, task, count(*) AS n_left_out FROM _left_out l WHERE NOT EXISTS (SELECT 1 "
                       f"FROM held_out h WHERE {join_on(INPUT_KEY, 'h', 'l')}) GROUP BY ALL").pl()
        # p_open over its decisions of the common inputs (one row per input: the evaluated inputs of the
        # evictor less every held-out pilot); Δ over its gated rows of them, both Δs in one scan
        common = con.sql(f"SELECT * FROM decisions SEMI JOIN _logged USING ({key}) ANTI JOIN _left_out USING ({key})")
        metrics.engine.known_unique(common, metrics.engine.input_key(common))
        po = metrics.p_open(common, by=by_task).select(*by_task, "p_open", pl.col("n").alias("n_evaluated"))
        rows = con.sql(relations.gated_query(draw_columns, outcomes="_evictor_outcomes", held_out="_left_out"))
        metrics.engine.known_unique(rows, [*metrics.engine.unit_key(rows), "budget"])
        d_task, d_cell = metrics.deltas(rows, [by_task, MODEL_CELL])
        d_task = d_task.select(*by_task, pl.col("delta").alias("delta_task"))
        d_cell = d_cell.select(*MODEL_CELL, pl.col("delta").alias("delta_cell"))
        # every (cell, task) of the policy keeps its row: one whose inputs all lie in some held-out pilot
        # has n_evaluated 0 and null rates
        summary = tasks.join(tau, on=list(MODEL_CELL), how="left").join(left, on=[*MODEL_CELL, "task"], how="left")
        summary = summary.join(po, on=by_task, how="left").join(d_task, on=by_task, how="left")
        summary = summary.join(d_cell, on=list(MODEL_CELL), how="left")
        summary = summary.with_columns(pl.col("n_left_out").fill_null(0).cast(pl.Int64),
                                       pl.col("n_evaluated").fill_null(0).cast(pl.Int64))
        out.append(summary.with_columns((pl.col("p_open") < 0.5).alias("closed_call"), pl.lit(ev).alias("evictor")))
    return out
