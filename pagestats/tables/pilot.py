"""A table the paper lacks: the sensitivity of the z-scored gate's call on a task to the
definition of its unlabelled pilot (App. A.3.4, §4.1).

It replays the logs (:mod:`pagestats.replay`) under every pilot definition, so it takes
:class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults
from pagestats.core.columns import MODEL_CELL, names_like, rows_where
from pagestats.replay.pilot import PILOT_SPLITS
from pagestats.replay.policies import ZScored
from pagestats.core.schema import INPUT_KEY
from pagestats.replay.pilot import pilot_need
from pagestats.tables._common import group_tau, inputs_per, logged_evictor

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
    unit = [*MODEL_CELL, "task", *(c for c in INPUT_KEY if c != "task")]
    ev = logged_evictor(logs, evictor)
    # the evictor's input keys and outcome rows: the units a replay of that evictor evaluates, less its held-out pilot
    ev_outcomes = rows_where(logs.outcomes, pl.col("evictor") == ev)  # the outcomes themselves when one evictor
    logged = ev_outcomes.select(INPUT_KEY).unique()

    def summary(tasks, sub, ev, left):
        # tasks: the definition's (cell, task) rows with its τ; sub: its gated rows of the common inputs.
        # Every (cell, task) of the definition keeps its row: one whose inputs all lie in some held-out
        # pilot has n_evaluated 0 and null rates; τ is the definition's, set on its own pilot
        rows = metrics.relation(sub)  # one relation: its outcome rows' key is checked once for both Δs
        po = names_like(metrics.p_open(rows, by=by_task), sub).select(*by_task, "p_open", pl.col("n").alias("n_evaluated"))
        d_task = names_like(metrics.delta(rows, by=by_task), sub).select(*by_task, pl.col("delta").alias("delta_task"))
        d_cell = names_like(metrics.delta(rows, by=MODEL_CELL), sub).select(*MODEL_CELL, pl.col("delta").alias("delta_cell"))
        out = tasks.join(left, on=[*MODEL_CELL, "task"], how="left")
        out = out.join(po, on=by_task, how="left").join(d_task, on=by_task, how="left")
        out = out.join(d_cell, on=list(MODEL_CELL), how="left")
        out = out.with_columns(pl.col("n_left_out").fill_null(0), pl.col("n_evaluated").fill_null(0).cast(pl.Int64))
        return out.with_columns((pl.col("p_open") < 0.5).alias("closed_call"), pl.lit(ev).alias("evictor"))

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
    # two passes, so that one replay's gated rows are held at a time: every definition decides once (D computed
    # once for all), keeping its decisions and the inputs it evaluates (one row per input); the definitions put
    # on their common inputs; then each replay's gated rows of the evictor, on those inputs
    policies = [reference, *(policy for *_, policy in definitions)]
    decision_cols = ["tau", "gate_open", "held_out"]
    base, decisions, units = None, [], []
    for frame in replay.decision_frames(logs, policies, profile):
        if base is None:
            base = frame.drop(decision_cols)
        elif not frame.select(unit).equals(base.select(unit)):  # pragma: no cover - decide keeps the row order
            raise AssertionError("pilot_sensitivity_table: the decisions of two definitions are not in one row order")
        decisions.append(frame.select(decision_cols))
        units.append(frame.filter(~pl.col("held_out")).select(unit).unique().join(logged, on=list(INPUT_KEY),
                                                                                      how="semi"))
    common, left = metrics.same_inputs(*units, by=[*MODEL_CELL, "task"])
    common = common[0].select(INPUT_KEY)
    del units
    # an input outside the common set is left out of a definition's Δ and p_open as its held-out pilot is
    # (gated_from_decisions drops held-out inputs): one pass over the outcomes, no copy of them
    key = pl.struct(INPUT_KEY)
    outside = ~base.select(key.is_in(common.select(key).to_series().implode())).to_series()

    def summarised(i, lo):
        decided = pl.concat([base, decisions[i]], how="horizontal")
        # τ per cell over the definition's evaluated rows (each input's τ on each of its outcome rows, as
        # group_tau reads them) and its (cell, task) rows, from narrow gated rows let go before the wide ones
        narrow = replay.gated_from_decisions(ev_outcomes, decided, (*by_task, "tau"))
        tau = narrow.group_by(list(MODEL_CELL)).agg(group_tau())
        tasks = narrow.select(by_task).unique().join(tau, on=list(MODEL_CELL), how="left")
        del narrow
        decided = decided.with_columns(pl.col("held_out") | outside)
        return summary(tasks, replay.gated_from_decisions(ev_outcomes, decided, replay.DELTA_COLUMNS), ev, lo)

    ref = summarised(0, left[0]).select(*by_task, pl.col("closed_call").alias("_ref"))
    parts = [
        summarised(i, lo).with_columns(pl.lit(split).alias("pilot_split"), pl.lit(label).alias("pilot_by"),
                                       pl.lit(n, pl.Int64).alias("pilot_n"))
        for i, ((split, label, n, _), lo) in enumerate(zip(definitions, left[1:]), start=1)
    ]
    out = pl.concat(parts).join(ref, on=by_task, how="left")
    out = out.with_columns((pl.col("closed_call") != pl.col("_ref")).alias("flips"))
    out = out.with_columns(pl.col("flips").sum().over(by_task).cast(pl.Int64).alias("n_flipping_definitions"))
    return out.select("pilot_split", "pilot_by", "pilot_n", *by_task, "evictor", "tau", "n_evaluated", "n_left_out", "p_open",
                      "closed_call",
                      "flips", "n_flipping_definitions", "delta_task", "delta_cell").sort(
                          ["pilot_split", "pilot_by", "pilot_n", *by_task])

