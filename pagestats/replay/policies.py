"""Gate policies as values: fixed τ, z-scored, midpoint, task-label oracle, custom callable.

A policy turns the per-input frame of the replay (one row per input, or per input and
head-pair draw) into a threshold ``tau`` and a decision ``gate_open``. The gate evicts iff
D ≥ τ (§3 "Algorithm", Eq. 2); every policy that has a threshold applies exactly that rule,
so a policy only has to say how τ is chosen.

Every policy is a frozen dataclass with a ``name`` and a method ``decide(frame)`` that
returns ``frame`` with two columns added: ``tau`` (Float64, null for the oracle and custom
policies, which have no threshold) and ``gate_open`` (Boolean, never null).

The frame given to ``decide`` has the columns ``run_id, task, input_id, [pair_draw], model,
context_length, task_class, n_tokens, full_score, drop, agreement`` (``agreement`` is the
stored a_ℓ list, for custom policies that read the whole profile).

References
----------
PAGE paper, §3 "Calibration"; App. A.3.4 (recipe, Eq. 5; z-scored variant; Table 8);
§4.1 and Table 14 (task-label oracle).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats.columns import with_task_class
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


def _draw_cols(frame: pl.DataFrame) -> list[str]:
    return ["pair_draw"] if "pair_draw" in frame.columns else []


def _check_group_cols(frame: pl.DataFrame, cols, what: str) -> list[str]:
    cols = list(cols)
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: grouping columns {missing} are not in the gate frame {frame.columns}")
    return cols


def pilot_hash(units: pl.DataFrame, seed: int = 0) -> pl.Series:
    """A seeded 64-bit hash of each input's identity (run_id, task, input_id).

    The order of a ``"random"`` / ``"held-out"`` pilot: it depends only on the input itself
    and the seed, so it is the same whatever the file order, the row order or the other
    runs loaded (BLAKE2b of ``"seed/run_id/task/input_id"``, first 8 bytes, big-endian).
    """
    keys = zip(units["run_id"].to_list(), units["task"].to_list(), units["input_id"].to_list())
    values = [
        int.from_bytes(hashlib.blake2b(f"{int(seed)}/{r}/{t}/{i}".encode(), digest_size=8).digest(), "big") >> 1
        for r, t, i in keys
    ]
    return pl.Series("_hash", values, dtype=pl.Int64)


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
    out of the pilot together.
    """
    if mode not in PILOT_SPLITS:
        raise ValueError(f"pilot split must be one of {PILOT_SPLITS}, got {mode!r}")
    if int(n) != n or n < 1:
        raise ValueError(f"pilot size must be a positive integer, got {n}")
    by = list(by)
    units = frame.select([*by, *INPUT_KEY]).unique().sort([*by, *PILOT_ORDER])
    if strict:
        sizes = units.group_by(by).len() if by else pl.DataFrame({"len": [units.height]})
        need = n + 1 if mode == "held-out" else n
        small = sizes.filter(pl.col("len") < need)
        if small.height:
            row = small.row(0, named=True)
            group = ", ".join(f"{c}={row[c]}" for c in by) or "all inputs"
            raise ValueError(f"pilot of {n} inputs is larger than the data: {group} has {row['len']} input(s)"
                             + (" and a held-out pilot must leave one to evaluate" if mode == "held-out" else ""))
    if mode != "first":
        units = units.with_columns(pilot_hash(units, seed)).sort([*by, "_hash", *PILOT_ORDER])
    rank = pl.int_range(pl.len()).over(by) if by else pl.int_range(pl.len())
    chosen = units.with_columns((rank < n).alias("_pilot")).select([*by, *INPUT_KEY, "_pilot"])
    joined = frame.select([*by, *INPUT_KEY]).join(chosen, on=[*by, *INPUT_KEY], how="left", maintain_order="left")
    return joined["_pilot"].fill_null(False).rename("pilot")


def _pilot_stats(frame: pl.DataFrame, mask: pl.Series, groups: list[str], col: str, prefix: str) -> pl.DataFrame:
    stats = (
        frame.filter(mask)
        .group_by(groups)
        .agg(
            pl.col(col).mean().alias(f"{prefix}_mu"),
            pl.col(col).std(ddof=1).alias(f"{prefix}_sigma"),
            pl.len().alias(f"{prefix}_n"),
        )
    )
    small = stats.filter(pl.col(f"{prefix}_n") < 2)
    if small.height:
        raise ValueError(f"a pilot group has fewer than 2 inputs, σ is undefined: {small.rows()[:3]}")
    return stats


def _with_pilot_moments(frame: pl.DataFrame, policy, columns: dict[str, str], what: str) -> tuple[pl.DataFrame, list[str]]:
    """``frame`` with the ``pilot`` mask of ``policy`` (its ``pilot_by``, ``pilot_n``, ``pilot``
    and ``seed``; a group smaller than the pilot is refused) and, per pilot group and
    head-pair draw, the pilot mean, sample SD and size of each column of ``columns``
    (``prefix → column``: ``{prefix}_mu``, ``{prefix}_sigma``, ``{prefix}_n``, App. A.3.4).
    Also returns the names of the added moment columns."""
    by = _check_group_cols(frame, policy.pilot_by, what)
    mask = pilot_mask(frame, by, policy.pilot_n, policy.pilot, policy.seed, strict=True)
    groups = [*by, *_draw_cols(frame)]
    out, added = frame, []
    for prefix, col in columns.items():
        out = out.join(_pilot_stats(frame, mask, groups, col, prefix), on=groups, how="left", maintain_order="left")
        added += [f"{prefix}_mu", f"{prefix}_sigma", f"{prefix}_n"]
    return out.with_columns(mask), added


def _with_tau(frame: pl.DataFrame, tau: pl.Expr | float) -> pl.DataFrame:
    tau_expr = tau if isinstance(tau, pl.Expr) else pl.lit(float(tau))
    out = frame.with_columns(tau_expr.cast(pl.Float64).alias("tau"))
    return out.with_columns(pl.sql_expr(GATE_RULE).alias("gate_open"))


@dataclass(frozen=True)
class FixedTau:
    """One global threshold: open iff D ≥ τ (§3 "Calibration"; τ = 0.07, Table 8)."""

    tau: float = defaults.TAU

    @property
    def name(self) -> str:
        return f"fixed(tau={self.tau!r})"

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        if not isinstance(self.tau, (int, float)) or np.isnan(self.tau):
            raise ValueError(f"FixedTau.tau must be a number, got {self.tau!r}")
        return _with_tau(frame, self.tau)


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

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        out, added = _with_pilot_moments(frame, self, {"_z": "drop"}, "ZScored.pilot_by")
        out = _with_tau(out, pl.col("_z_mu") + self.theta_z * pl.col("_z_sigma"))
        return out.drop(added)


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

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        if "reference_drop" not in frame.columns:
            raise ValueError("RecalibratedTau needs the reference D (reference_drop) in the gate frame")
        out, added = _with_pilot_moments(frame, self, {"_r": "reference_drop", "_c": "drop"},
                                         "RecalibratedTau.pilot_by")
        theta = (pl.lit(float(self.tau)) - pl.col("_r_mu")) / pl.col("_r_sigma")
        out = _with_tau(out, pl.col("_c_mu") + theta * pl.col("_c_sigma"))
        return out.drop(added)


@dataclass(frozen=True)
class Midpoint:
    """The 40-input recipe, Eq. 5: τ = (D̄_C + D̄_D)/2 per calibration group (App. A.3.4).

    Parameters
    ----------
    n : int
        Inputs per class (the paper: 20 NIAH-MK3 + 20 VT).
    by : tuple of str
        Calibration groups; ``("model", "context_length")`` = "for a new (model, context)".
    capacity_tasks, dilution_tasks : tuple of str, optional
        Tasks that supply the capacity-bound and dilution-prone samples (the paper uses
        ``("niah_multikey_3",)`` and ``("vt",)``). By default the ``task_class`` column
        decides: capacity-bound inputs vs dilution-prone inputs.
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

    n: int = defaults.MIDPOINT_N
    by: tuple[str, ...] = ("model", "context_length")
    capacity_tasks: tuple[str, ...] | None = None
    dilution_tasks: tuple[str, ...] | None = None
    pilot: str = "first"
    seed: int = 0

    @property
    def name(self) -> str:
        return f"midpoint(n={self.n}, by={','.join(self.by)})"

    @property
    def held_out(self) -> bool:
        return self.pilot == "held-out"

    def _class_expr(self, tasks, klass: str) -> pl.Expr:
        if tasks is not None:
            return pl.col("task").is_in(list(tasks))
        return pl.col("task_class") == klass

    def _classes(self):
        return (("_mean_c", self.capacity_tasks, defaults.CAPACITY_BOUND),
                ("_mean_d", self.dilution_tasks, defaults.DILUTION_PRONE))

    def shortfall(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Per calibration group of ``frame`` (gate or inputs rows), the distinct inputs of each
        class and ``note``: null where the recipe applies, else why not (fewer than ``n``
        inputs of a class, Eq. 5).

        Returns
        -------
        polars.DataFrame
            ``by`` columns, ``n_capacity``, ``n_dilution``, ``note``.
        """
        by = _check_group_cols(frame, self.by, "Midpoint.by")
        out = frame.select(by).unique()
        for (label, tasks, klass), name in zip(self._classes(), ("n_capacity", "n_dilution")):
            counts = frame.filter(self._class_expr(tasks, klass)).group_by(by).agg(
                pl.struct(INPUT_KEY).n_unique().cast(pl.Int64).alias(name))
            out = out.join(counts, on=by, how="left", nulls_equal=True).with_columns(pl.col(name).fill_null(0))
        cap = "capacity-bound" + (f" ({', '.join(self.capacity_tasks)})" if self.capacity_tasks else "")
        dil = "dilution-prone" + (f" ({', '.join(self.dilution_tasks)})" if self.dilution_tasks else "")
        short = (pl.col("n_capacity") < self.n) | (pl.col("n_dilution") < self.n)
        note = pl.format(f"the midpoint recipe (Eq. 5) takes {self.n} {cap} and {self.n} {dil} inputs; "
                         "this cell has {} and {}", "n_capacity", "n_dilution")
        return out.with_columns(pl.when(short).then(note).otherwise(pl.lit(None, pl.String)).alias("note")).sort(by)

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

    def decide(self, frame: pl.DataFrame) -> pl.DataFrame:
        by = _check_group_cols(frame, self.by, "Midpoint.by")
        short = self.shortfall(frame).filter(pl.col("note").is_not_null())
        if short.height:
            row = short.row(0, named=True)
            cell = ", ".join(f"{c}={row[c]}" for c in by)
            more = f" (and {short.height - 1} more)" if short.height > 1 else ""
            raise ValueError(f"{row['note']} ({cell}){more}")
        groups = [*by, *_draw_cols(frame)]
        means, members = [], []
        for label, tasks, klass in self._classes():
            part = frame.filter(self._class_expr(tasks, klass))
            part = part.filter(pilot_mask(part, by, self.n, self.pilot, self.seed))
            means.append(part.group_by(groups).agg(pl.col("drop").mean().alias(label)))
            members.append(part.select(INPUT_KEY).unique())
        chosen = pl.concat(members).unique().with_columns(pl.lit(True).alias("pilot"))
        out = frame.join(chosen, on=INPUT_KEY, how="left", maintain_order="left")
        out = out.with_columns(pl.col("pilot").fill_null(False))
        out = out.join(means[0], on=groups, how="left", maintain_order="left")
        out = out.join(means[1], on=groups, how="left", maintain_order="left")
        out = _with_tau(out, (pl.col("_mean_c") + pl.col("_mean_d")) / 2)
        return out.drop("_mean_c", "_mean_d")


@dataclass(frozen=True)
class TaskOracle:
    """Task-label oracle (§4.1, Table 14): closed on capacity-bound task inputs, open elsewhere.

    It reads the ``task_class`` column (task → class mapping from the logs), not D; ``tau``
    is null.
    """

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
        raise ValueError(f"--recalibrate must be one of {RECALIBRATE_MODES}, got {mode!r}")
    if mode == "none":
        return policy
    if not isinstance(policy, FixedTau):
        raise ValueError(f"--recalibrate {mode} applies to a fixed τ; {getattr(policy, 'name', policy)} "
                         "already derives its threshold from the statistic it gates on")
    if mode == "z":
        return RecalibratedTau(tau=policy.tau, pilot_n=pilot_n, pilot_by=tuple(pilot_by), pilot=pilot, seed=seed)
    return Midpoint()
