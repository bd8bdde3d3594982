"""Gate policies as values: fixed τ, z-scored, midpoint, task-label oracle, custom callable.

The gate evicts iff D ≥ τ (§3 "Algorithm", Eq. 2); every policy that has a threshold applies
exactly that rule, so a policy only says how τ is chosen, in one ``calibrate(con, source)``
(:class:`~pagestats.replay.calibration.Policy`). ``tau`` is null for the oracle and custom
policies, which have none. The rows carry ``run_id, task, input_id, [pair_draw], model,
context_length, task_class, n_tokens, full_score, drop`` and the columns of the policy's ``reads``
(the a_ℓ list ``agreement`` only for a :class:`CustomPolicy`: head-pair draws would repeat it on
every draw).

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (recipe, Eq. 5; z-scored variant; Table 8);
§4.1 and Table 14 (task-label oracle).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.core.columns import names_like, with_task_class
from pagestats.core.formulas import GATE_RULE
from pagestats.replay.calibration import Policy, decision_query, standardised, store_calibration, stored_groups
from pagestats.replay.pilot import frame_query, pilot_query
from pagestats.replay.sqltext import (
    draw_columns,
    group_columns,
    join_on,
    quoted,
    relation_columns,
    sql_float,
    sql_string,
)
from pagestats.core.schema import INPUT_KEY


@dataclass(frozen=True)
class FixedTau(Policy):
    """One global threshold: open iff D ≥ τ (§3 "Calibration"; τ = 0.07, Table 8)."""

    labels: ClassVar[str] = "none: τ is a constant"
    used_in: ClassVar[str] = "every table and figure (the report's policy by default)"

    tau: float = defaults.TAU

    @property
    def name(self) -> str:
        return f"fixed(tau={self.tau!r})"

    @property
    def fixed_tau(self) -> float:
        return self._checked()

    def _checked(self) -> float:
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or np.isnan(self.tau):
            raise ValueError(f"FixedTau.tau must be a number, got {self.tau!r}")
        return self.tau

    def calibrate(self, con, source: str) -> str:
        tau = sql_float(self._checked())
        return f"SELECT *, false AS in_pilot, {GATE_RULE} AS gate_open FROM (SELECT *, {tau} AS tau FROM {source})"

    def recalibrated(self, mode: str, **pilot) -> Policy:
        if mode == "z":
            return RecalibratedTau(tau=self.tau, **pilot)
        return Midpoint()


@dataclass(frozen=True)
class ZScored(Policy):
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
    pilot_split : {"held-out", "random", "first"}
        Which inputs form the pilot; see :func:`~pagestats.replay.pilot.pilot_mask`. The default ``"held-out"``
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
    has_pilot: ClassVar[bool] = True

    theta_z: float = defaults.THETA_Z
    pilot_n: int = defaults.PILOT_N
    pilot_by: tuple[str, ...] = ("model",)
    pilot_split: str = defaults.PILOT_SPLIT
    seed: int = 0

    @property
    def name(self) -> str:
        return f"z(theta={self.theta_z!r}, pilot_split={self.pilot_split}, pilot_n={self.pilot_n}, by={','.join(self.pilot_by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot_split == "held-out"

    def calibrate(self, con, source: str) -> str:
        """Draw the pilot and set τ = μ + θ_z σ per pilot group and head-pair draw."""
        return standardised(self, con, source, relation_columns(con, source), {"_z": "drop"},
                             f"_z_mu + {sql_float(self.theta_z)} * _z_sigma")

    def record(self, con) -> list[tuple[dict, dict]]:
        """μ and σ as they set τ (τ = μ + θ σ in doubles, as DuckDB added them), and the pilot."""
        return [(group, {**moments, "theta": float(self.theta_z), "split": self.pilot_split, "seed": int(self.seed)})
                for group, moments in stored_groups(con, self.pilot_by, {"mu": "_z_mu", "sigma": "_z_sigma", "n": "_n"})]


@dataclass(frozen=True)
class RecalibratedTau(Policy):
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
    pilot_n, pilot_by, pilot_split, seed
        The pilot, as for :class:`ZScored` (the same rule; ``"held-out"`` by default).
    """

    labels: ClassVar[str] = "none: τ keeps its z-position in an unlabeled pilot of the reference D"
    used_in: ClassVar[str] = "whatif --recalibrate; the k, layer and head-pair sweeps (Tables 9, 10, App. A.3.1)"
    has_pilot: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = ("reference_drop",)

    tau: float = defaults.TAU
    pilot_n: int = defaults.PILOT_N
    pilot_by: tuple[str, ...] = ("model",)
    pilot_split: str = defaults.PILOT_SPLIT
    seed: int = 0

    @property
    def name(self) -> str:
        return f"recalibrated(tau={self.tau!r}, pilot_split={self.pilot_split}, pilot_n={self.pilot_n}, by={','.join(self.pilot_by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot_split == "held-out"

    def calibrate(self, con, source: str) -> str:
        """As :meth:`ZScored.calibrate`, with τ' = μ' + θ σ', θ = (τ − μ_ref)/σ_ref per pilot group
        and head-pair draw (``reference_drop`` is the reference D, ``drop`` the changed one)."""
        columns = relation_columns(con, source)
        if "reference_drop" not in columns:
            raise ValueError("RecalibratedTau needs the reference D (reference_drop) in the gate frame")
        theta = f"(({sql_float(self.tau)} - _r_mu) / _r_sigma)"
        return standardised(self, con, source, columns, {"_r": "reference_drop", "_c": "drop"},
                             f"_c_mu + {theta} * _c_sigma")


@dataclass(frozen=True)
class Midpoint(Policy):
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
        capacity-bound task (NIAH-MK3)" and 20 from VT; :data:`pagestats.core.defaults.MIDPOINT_TASKS`).
        ``None`` for both pools by the ``task_class`` column instead: capacity-bound inputs vs
        dilution-prone inputs of any task.
    pilot_split : {"first", "random"}
        Which n inputs of each class; see :func:`~pagestats.replay.pilot.pilot_mask`.
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
    has_pilot: ClassVar[bool] = True

    n: int = defaults.MIDPOINT_N
    by: tuple[str, ...] = ("model", "context_length")
    capacity_tasks: tuple[str, ...] | None = defaults.MIDPOINT_TASKS[:1]
    dilution_tasks: tuple[str, ...] | None = defaults.MIDPOINT_TASKS[1:]
    pilot_split: str = "first"
    seed: int = 0

    @property
    def name(self) -> str:
        samples = ("by class" if self.capacity_tasks is None and self.dilution_tasks is None else
                   f"{'+'.join(self.capacity_tasks or ('class',))} vs {'+'.join(self.dilution_tasks or ('class',))}")
        return f"midpoint(n={self.n}, {samples}, by={','.join(self.by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot_split == "held-out"

    def _class_sql(self, tasks, klass: str) -> str:
        if tasks is not None:
            return f"task IN ({', '.join(map(sql_string, tasks))})" if tasks else "FALSE"
        return f"task_class = {sql_string(klass)}"

    def _classes(self):
        return (("c", self.capacity_tasks, defaults.CAPACITY_BOUND),
                ("d", self.dilution_tasks, defaults.DILUTION_PRONE))

    def shortfall_query(self, source: str, by) -> str:
        """:meth:`shortfall` as DuckDB SQL over the relation ``source``."""
        by = list(by)
        lead = f"{quoted(by)}, " if by else ""
        (_, cap_tasks, cap_class), (_, dil_tasks, dil_class) = self._classes()
        cap = "capacity-bound" + (f" ({', '.join(self.capacity_tasks)})" if self.capacity_tasks else "")
        dil = "dilution-prone" + (f" ({', '.join(self.dilution_tasks)})" if self.dilution_tasks else "")
        text = f"the midpoint recipe (Eq. 5) takes {self.n} {cap} and {self.n} {dil} inputs; this cell has "
        n = int(self.n)
        return f"""
            SELECT {lead}n_capacity, n_dilution,
                CASE WHEN n_capacity < {n} OR n_dilution < {n} THEN {sql_string(text)} || CAST(n_capacity AS VARCHAR)
                    || ' and ' || CAST(n_dilution AS VARCHAR) END AS note
            FROM (
                SELECT {lead}CAST(coalesce(sum(CAST(_cap AS BIGINT)), 0) AS BIGINT) AS n_capacity,
                    CAST(coalesce(sum(CAST(_dil AS BIGINT)), 0) AS BIGINT) AS n_dilution
                FROM (SELECT DISTINCT {quoted([*by, *INPUT_KEY])}, {self._class_sql(cap_tasks, cap_class)} AS _cap,
                        {self._class_sql(dil_tasks, dil_class)} AS _dil FROM {source})
                GROUP BY ALL
            ){f" ORDER BY {', '.join(f'{c} NULLS FIRST' for c in quoted(by).split(', '))}" if by else ""}"""

    def shortfall(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Per calibration group of ``frame`` (gate or inputs rows), the distinct inputs of each
        class and ``note``: null where the recipe applies, else why not (fewer than ``n``
        inputs of a class, Eq. 5).

        Returns
        -------
        polars.DataFrame
            ``by`` columns, ``n_capacity``, ``n_dilution``, ``note``.
        """
        by = group_columns(frame.columns, self.by, "Midpoint.by")
        return frame_query(frame, lambda con, source: self.shortfall_query(source, by))

    def applicable(self, logs):
        """``logs`` (a :class:`pagestats.io.Logs`) restricted to the calibration groups where the recipe
        applies, and the :meth:`shortfall` rows (with their ``note``) of the groups left out. The
        logs are ``logs`` itself, not a copy, when no group is left out."""
        short = names_like(self.shortfall(with_task_class(logs.inputs)), logs.inputs)  # read back from SQL
        kept = logs.inputs.join(short.filter(pl.col("note").is_null()).select(self.by), on=list(self.by), how="semi",
                                nulls_equal=True)
        if kept.height == logs.inputs.height:  # every group applies (a semi join keeps the rows' order)
            return logs, short.filter(pl.col("note").is_not_null())
        keys = kept.select(INPUT_KEY)
        topk = None if logs.topk is None else logs.topk.join(keys, on=INPUT_KEY, how="semi")
        sub = dataclasses.replace(logs, inputs=kept, outcomes=logs.outcomes.join(keys, on=INPUT_KEY, how="semi"),
                                  topk=topk)
        return sub, short.filter(pl.col("note").is_not_null())

    def calibrate(self, con, source: str) -> str:
        """Refuse a group short of ``n`` inputs of a class (:meth:`shortfall`), draw the pilot of
        each class and set τ = (D̄_C + D̄_D)/2 per group and head-pair draw."""
        columns = relation_columns(con, source)
        by = group_columns(columns, self.by, "Midpoint.by")
        short = con.sql(f"SELECT * FROM ({self.shortfall_query(source, by)}) WHERE note IS NOT NULL").fetchall()
        if short:
            row = dict(zip([*by, "n_capacity", "n_dilution", "note"], short[0]))
            cell = ", ".join(f"{c}={row[c]}" for c in by)
            more = f" (and {len(short) - 1} more)" if len(short) > 1 else ""
            raise ValueError(f"{row['note']} ({cell}){more}")
        groups = [*by, *draw_columns(columns)]
        pilots, means = [], []
        for label, tasks, klass in self._classes():
            part = f"(SELECT * FROM {source} WHERE {self._class_sql(tasks, klass)})"
            pilot = pilot_query(part, by, self.n, self.pilot_split, self.seed)
            pilots.append(f"SELECT '{label}' AS _class, * FROM ({pilot})")
            means.append(f'SELECT {quoted(groups)}, list_avg(list("drop" ORDER BY {quoted(INPUT_KEY)})) '
                         f"AS _mean_{label}, count(*) AS _n_{label}, list_sort(list_distinct(list(task))) AS _tasks_{label} "
                         f"FROM {part} s SEMI JOIN (SELECT * FROM _pilot_units WHERE _class = '{label}') p "
                         f"ON {join_on([*by, *INPUT_KEY], 's', 'p')} GROUP BY {quoted(groups)}")
        tau = (f"SELECT *, (_mean_c + _mean_d) / 2 AS tau FROM ({means[0]}) FULL JOIN ({means[1]}) "
               f"USING ({quoted(groups)})")
        store_calibration(con, source, " UNION ALL ".join(f"({p})" for p in pilots), tau)
        return decision_query(source, groups, list(INPUT_KEY))

    def record(self, con) -> list[tuple[dict, dict]]:
        """The two class means as they set τ (Eq. 5), their sizes and tasks."""
        fields = {"capacity_mean": "_mean_c", "dilution_mean": "_mean_d", "n_capacity": "_n_c",
                  "n_dilution": "_n_d", "capacity": "_tasks_c", "dilution": "_tasks_d"}
        return [(group, {**{k: v for k, v in f.items() if k not in ("capacity", "dilution")},
                         "tasks": {"capacity": f["capacity"], "dilution": f["dilution"]}})
                for group, f in stored_groups(con, self.by, fields)]


@dataclass(frozen=True)
class TaskOracle(Policy):
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
        """The decision as SQL."""
        return f"task_class <> {sql_string(self.capacity_class)}"

    def calibrate(self, con, source: str) -> str:
        if con.sql(f"SELECT count(*) FROM {source} WHERE task_class IS NULL").fetchall()[0][0]:
            raise ValueError("TaskOracle: task_class is null for some inputs")
        return f"SELECT *, CAST(NULL AS DOUBLE) AS tau, false AS in_pilot, {self.rule} AS gate_open FROM {source}"


@dataclass(frozen=True)
class CustomPolicy(Policy):
    """Any decision computed from the stored profile: ``fn(frame) -> bool array``, open where True.

    ``fn`` receives the gate frame (per-input ``drop`` and the profile columns listed in the
    module docstring) and must return one boolean per row, in row order. ``tau`` is null. It sees
    every head-pair draw at once, so it may pool them.
    """

    reads: ClassVar[tuple[str, ...]] = ("agreement",)
    per_draw: ClassVar[bool] = False

    fn: Callable[[pl.DataFrame], object] = field(compare=False)
    name: str = "custom"

    def calibrate(self, con, source: str) -> str:
        """``fn`` on the rows of ``source`` in key order (Python, on a polars frame), joined back."""
        keys = [*INPUT_KEY, *draw_columns(relation_columns(con, source))]
        frame = con.sql(f"SELECT * FROM {source} ORDER BY {quoted(keys)}").pl()
        con.register("_custom_decisions", self.decide(frame).select(*keys, "gate_open"))
        return (f"SELECT s.*, CAST(NULL AS DOUBLE) AS tau, false AS in_pilot, c.gate_open FROM {source} s "
                f"JOIN _custom_decisions c ON {join_on(keys, 's', 'c')}")

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        result = self.fn(frame)
        if isinstance(result, pl.Series):
            result = result.to_numpy()
        arr = np.asarray(result)
        if arr.shape != (frame.height,):
            raise ValueError(f"CustomPolicy {self.name!r}: fn returned shape {arr.shape}, expected ({frame.height},)")
        if arr.dtype != bool:
            raise TypeError(f"CustomPolicy {self.name!r}: fn must return booleans, got dtype {arr.dtype}")
        return frame.with_columns(pl.lit(False).alias("in_pilot"), pl.lit(None, dtype=pl.Float64).alias("tau"),
                                  pl.Series("gate_open", arr))


#: ``--recalibrate`` modes: keep τ, carry it by standardisation, or re-derive it with Eq. 5.
RECALIBRATE_MODES = ("none", "z", "midpoint")


def recalibrate(policy: Policy, mode: str, *, pilot_n: int = defaults.PILOT_N, pilot_by=("model",),
                pilot_split: str = defaults.PILOT_SPLIT, seed: int = 0) -> Policy:
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
    return policy.recalibrated(mode, pilot_n=pilot_n, pilot_by=tuple(pilot_by), pilot_split=pilot_split, seed=seed)
