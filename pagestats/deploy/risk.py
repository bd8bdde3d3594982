"""The risk-controlled gate: τ certified by Learn then Test on the held-out pilot (``pagestats calibrate
--policy risk``), its validation by repeated splits, and its comparison with the paper's recipes.

The gate evicts iff D ≥ τ (PAGE §3, Eq. 2); at budget b its harm is the share of inputs whose gated
score falls below their full-KV score (Table 27). :func:`risk_gate` draws the calibration inputs as
the project's held-out pilot (:func:`pagestats.replay.pilot.pilot_mask`, split ``"held-out"``, one
pilot per model, App. A.3.4), labels each with whether plain eviction at (evictor, b) harms it, and
certifies τ with :func:`pagestats.stats.ltt.fixed_sequence_threshold`: with probability ≥ 1 − δ over
the calibration draw, the gate's harm at b on inputs exchangeable with them is ≤ A.

:func:`split_validation` checks the guarantee on logs by repeated random calibration/test splits;
:func:`policy_comparison` sets the certified τ beside the fixed τ = 0.07 (Table 8), the z-scored
τ (App. A.3.4) and the midpoint recipe (Eq. 5) on each (model, context, evictor) cell: harm, p_open
and compression (App. A.6.2) at b.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults, formulas
from pagestats.deploy.calibrate import _model_source, _n_layers, _prompt_style, _statistic, logs_sha256
from pagestats.core.columns import MATRIX_CELL
from pagestats.deploy.gatefile import Gate
from pagestats.core.registry import POLICIES, deployable, policy_class
from pagestats.replay.calibration import Policy, calibration, decision_query, stored_groups
from pagestats.replay.pilot import pilot_query, refuse_small_groups
from pagestats.replay.sqltext import group_columns, join_on, quoted, relation_columns, sql_string
from pagestats.core.schema import INPUT_KEY
from pagestats.stats._results import _Result
from pagestats.stats.ltt import Certificate, fixed_sequence_threshold

__all__ = ["NEVER_OPENS", "RiskControlled", "SplitValidation", "harm_labels", "labelled_rows", "policy_comparison",
           "risk_gate", "split_validation"]

#: The τ of a gate that never opens: D is a difference of two means of Jaccard indices (Eq. 3), so
#: it lies in [−1, 1] and no input reaches 2.
NEVER_OPENS = 2.0


@dataclass(frozen=True)
class RiskControlled(Policy):
    """τ certified by Learn then Test on a held-out pilot of each model (module docstring): with
    probability ≥ 1 − δ the gated harm at the budget is ≤ A.

    It reads ``harmed``, each input's harm under plain eviction at (``evictor``, ``budget``)
    (:func:`harm_labels`), which the logs' inputs do not carry: :func:`risk_gate` adds it, and
    ``whatif`` does not replay it (:data:`pagestats.core.registry.POLICIES`).
    """

    labels: ClassVar[str] = "harm labels of the pilot: plain eviction below the full KV cache at the budget (Table 27)"
    used_in: ClassVar[str] = "calibrate --policy risk"
    has_pilot: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = ("harmed",)

    harm_bound: float
    delta: float
    budget: float
    evictor: str
    pilot_n: int = defaults.PILOT_N
    seed: int = 0

    @property
    def name(self) -> str:
        return (f"risk(A={float(self.harm_bound)!r}, delta={float(self.delta)!r}, budget={float(self.budget)!r}, "
                f"evictor={self.evictor})")

    @property
    def held_out(self) -> bool:
        return True

    def calibrate(self, con, source: str) -> str:
        """The held-out pilot per model, and per model the τ of :func:`~pagestats.stats.ltt.fixed_sequence_threshold`
        on its pilot's D and harm labels in input order (:data:`NEVER_OPENS` when none is certified)."""
        by = group_columns(relation_columns(con, source), ("model",), "RiskControlled")
        refuse_small_groups(con, source, by, self.pilot_n, "held-out")
        con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_units AS "
                    f"{pilot_query(source, by, int(self.pilot_n), 'held-out', int(self.seed))}")
        rows = con.sql(f'SELECT model, "drop", harmed FROM {source} s SEMI JOIN _pilot_units p '
                       f"ON {join_on([*by, *INPUT_KEY], 's', 'p')} ORDER BY model, {quoted(INPUT_KEY)}").fetchall()
        taus = []
        for model, group in itertools.groupby(rows, key=lambda r: r[0]):
            group = list(group)
            cert = fixed_sequence_threshold(np.array([r[1] for r in group], dtype=np.float64),
                                            np.array([r[2] for r in group], dtype=bool),
                                            harm_bound=self.harm_bound, delta=self.delta)
            taus.append(f"SELECT {sql_string(model)} AS model, "
                        f"CAST('{NEVER_OPENS if cert.tau is None else cert.tau!r}' AS DOUBLE) AS tau, "
                        f"{sql_string(json.dumps(cert.to_dict()))} AS _certificate")
        con.execute(f"CREATE OR REPLACE TEMP TABLE _pilot_tau AS {' UNION ALL '.join(taus)}")
        return decision_query(source, by, [*by, *INPUT_KEY])

    def record(self, con) -> list[tuple[dict, dict]]:
        """The certificate of each model's τ (:class:`~pagestats.stats.ltt.Certificate`)."""
        return [(group, {"certificate": json.loads(f["certificate"])})
                for group, f in stored_groups(con, ("model",), {"certificate": "_certificate"})]


def _one(values: list, what: str, option_free_hint: str):
    if len(values) != 1:
        raise ValueError(f"risk: the logs hold {len(values)} {what} ({', '.join(map(str, values))}); {option_free_hint}")
    return values[0]


def harm_labels(logs, inputs: pl.DataFrame, *, budget: float, evictor: str) -> np.ndarray:
    """Whether plain eviction at (``evictor``, ``budget``) harms each row of ``inputs`` (its score
    below its ``full_score``, Table 27), in the rows' order. Every input must have that outcome."""
    rows = logs.outcomes.filter((pl.col("evictor") == evictor) & (pl.col("budget") == float(budget)))
    joined = inputs.select(*INPUT_KEY, "full_score").join(rows.select(*INPUT_KEY, "score"), on=list(INPUT_KEY),
                                                          how="left", maintain_order="left")
    missing = joined.filter(pl.col("score").is_null())
    if missing.height:
        first = missing.row(0, named=True)
        raise ValueError(f"risk: {missing.height} input(s) have no {evictor} outcome at budget {budget!r} "
                         f"(first: {first['run_id']}/{first['task']}/{first['input_id']})")
    unknown = joined.filter(pl.col("full_score").is_null())
    if unknown.height:
        first = unknown.row(0, named=True)
        raise ValueError(f"risk: {unknown.height} input(s) have no full-KV outcome, so harm is unknown on them "
                         f"(first: {first['run_id']}/{first['task']}/{first['input_id']}); exclude them")
    return (joined["score"] < joined["full_score"]).to_numpy()


def labelled_rows(logs, rows: pl.DataFrame, *, budget: float, evictor: str) -> tuple[pl.DataFrame, dict]:
    """The rows of ``rows`` (inputs) whose harm at (``evictor``, ``budget``) is known, and how many of the
    others were left out and why: ``{"no_outcome": n, "unknown_full": n}`` (inputs of a run without
    that evictor or budget; inputs whose full-KV outcome was not logged, as in an imported release)."""
    have = logs.outcomes.filter((pl.col("evictor") == evictor) & (pl.col("budget") == float(budget))).select(INPUT_KEY)
    with_outcome = rows.join(have, on=list(INPUT_KEY), how="semi")
    known = with_outcome.filter(pl.col("full_score").is_not_null())
    return known, {"no_outcome": rows.height - with_outcome.height, "unknown_full": with_outcome.height - known.height}


def _choices(logs, model, evictor, budget) -> tuple[str, str, float]:
    models = sorted(logs.inputs["model"].unique().to_list())
    if model is None:
        model = _one(models, "models", "choose one")
    elif model not in models:
        raise ValueError(f"risk: no inputs of model {model!r} in the logs (they hold {', '.join(models)})")
    evictors = sorted(logs.outcomes["evictor"].unique().to_list())
    if evictor is None:
        evictor = _one(evictors, "evictors", "choose the one the deployment runs")
    elif evictor not in evictors:
        raise ValueError(f"risk: no outcomes of evictor {evictor!r} in the logs (they hold {', '.join(evictors)})")
    budgets = sorted(logs.outcomes.filter(pl.col("evictor") == evictor)["budget"].unique().to_list())
    if float(budget) not in budgets or float(budget) >= 1.0:
        raise ValueError(f"risk: budget {budget!r} is not an eviction budget of {evictor} in the logs "
                         f"({', '.join(f'{b:g}' for b in budgets if b < 1.0)})")
    return model, evictor, float(budget)


def risk_gate(logs, *, harm_bound: float, delta: float, budget: float, evictor: str | None = None,
              model: str | None = None, pilot_n: int = defaults.PILOT_N, seed: int = 0, files=None) -> Gate:
    """The gate whose τ Learn then Test certifies (module docstring), for one model, evictor and budget.

    Parameters
    ----------
    logs : pagestats.io.Logs
        Validated logs with the evictor's outcomes (the labels).
    harm_bound, delta : float
        A and δ, in (0, 1): harm at ``budget`` ≤ A with probability ≥ 1 − δ.
    budget : float
        The eviction budget b the harm is measured at (a logged budget < 1).
    evictor, model : str, optional
        Required when the logs hold several.
    pilot_n, seed : int
        The held-out pilot per model (``pilot_n`` calibration inputs, drawn by the seeded hash).
    files : sequence of paths, optional
        The data files to hash (default: the logs' file records).

    Returns
    -------
    Gate
        ``policy="risk"``; ``tau`` the certified τ, or :data:`NEVER_OPENS` when none is; ``pilot``
        records A, δ, b, the evictor, n, the observed harm, the certificate
        (:class:`~pagestats.stats.ltt.Certificate`), the calibration inputs' keys and their D, and
        ``left_out``: the model's inputs whose harm at b is not known (:func:`labelled_rows`), which
        the pilot is not drawn from.
    """
    model, evictor, budget = _choices(logs, model, evictor, budget)
    rows = logs.inputs.filter(pl.col("model") == model)
    manifests = {r: logs.manifests[r] for r in rows["run_id"].unique().to_list() if r in logs.manifests}
    statistic = _statistic(manifests)
    rows, left_out = labelled_rows(logs, rows, budget=budget, evictor=evictor)
    policy = RiskControlled(harm_bound, delta, budget, evictor, int(pilot_n), int(seed))
    rows = rows.with_columns(pl.Series("harmed", harm_labels(logs, rows, budget=budget, evictor=evictor)))
    decided, ((_, recorded),) = calibration(policy, rows)
    cal = decided.filter(pl.col("in_pilot")).sort(INPUT_KEY)
    cert = recorded["certificate"]
    pilot = {
        "policy_name": policy.name,
        "harm_bound": float(harm_bound), "delta": float(delta), "budget": budget, "evictor": evictor,
        "n": cert["n"], "observed_harm": cert["harm"], "certified": "tau" in cert, "certificate": cert,
        "split": "held-out", "pilot_n": int(pilot_n), "seed": int(seed),
        "calibration_inputs": [list(k) for k in cal.select(INPUT_KEY).iter_rows()],
        "drops": [float(d) for d in cal["drop"]], "p_open": cert["p_open"], "n_inputs": cert["n"], "left_out": left_out,
    }
    file_paths = files if files is not None else [f.path for f in logs.files]
    return Gate(tau=float(decided["tau"][0]), policy=policy.short, model=model,
                n_layers=_n_layers(manifests), pilot=pilot, logs_sha256=logs_sha256(file_paths), mode=logs.mode,
                prompt_style=_prompt_style(manifests), model_source=_model_source(manifests),
                created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **statistic)


@dataclass(frozen=True)
class SplitValidation(_Result):
    """Repeated random calibration/test splits of one set of labelled inputs.

    ``share_test_above``: the splits whose realized harm on the test inputs exceeds A;
    ``share_pool_above``: those whose certified τ has harm above A on all the inputs (the finite
    population the splits draw from, which the guarantee is about); each with its Monte Carlo
    standard error √(s(1 − s)/n_splits). ``share_certified``: splits where some τ was certified.
    """

    harm_bound: float
    delta: float
    n_inputs: int
    n_calibration: int
    n_splits: int
    share_test_above: float
    mc_se_test: float
    share_pool_above: float
    mc_se_pool: float
    share_certified: float
    mean_test_harm: float
    mean_p_open: float


def split_validation(drops, harmed, *, harm_bound: float, delta: float, n_calibration: int, n_splits: int,
                     rng: np.random.Generator) -> SplitValidation:
    """Certify τ on ``n_calibration`` inputs drawn at random without replacement, measure its harm on
    the rest, ``n_splits`` times (a gate that never opens has harm 0)."""
    d, h = np.asarray(drops, dtype=np.float64), np.asarray(harmed, dtype=bool)
    n = d.size
    if not 0 < int(n_calibration) < n:
        raise ValueError(f"n_calibration must lie in [1, {n - 1}], got {n_calibration}")
    test_above = pool_above = certified = 0
    test_harm, p_open = [], []
    for _ in range(int(n_splits)):
        perm = rng.permutation(n)
        c, t = perm[: int(n_calibration)], perm[int(n_calibration):]
        cert: Certificate = fixed_sequence_threshold(d[c], h[c], harm_bound=harm_bound, delta=delta)
        tau = NEVER_OPENS if cert.tau is None else cert.tau
        harm_t = float(np.mean((d[t] >= tau) & h[t]))
        test_harm.append(harm_t)
        p_open.append(float(np.mean(d[t] >= tau)))
        test_above += harm_t > harm_bound
        pool_above += float(np.mean((d >= tau) & h)) > harm_bound
        certified += cert.tau is not None
    k = int(n_splits)

    def se(s):
        return float(np.sqrt(s * (1.0 - s) / k))

    return SplitValidation(float(harm_bound), float(delta), int(n), int(n_calibration), k, test_above / k,
                           se(test_above / k), pool_above / k, se(pool_above / k), certified / k,
                           float(np.mean(test_harm)), float(np.mean(p_open)))


def policy_comparison(logs, gate: Gate) -> pl.DataFrame:
    """Fixed τ = 0.07, z-scored, midpoint and the risk gate on each (model, context) cell of the risk
    gate's evictor at its budget: harm (gated arm, Table 27), p_open and compression (1 / kept KV, App. A.6.2).

    The risk gate is evaluated on the inputs outside its calibration set; the z-scored gate (held-out
    pilot) outside its pilot; a cell where the midpoint recipe does not apply (too few inputs of a
    class, Eq. 5) gets no midpoint row, and the ``note`` column of the others says nothing.
    """
    budget = float(gate.pilot["budget"])
    cal = pl.DataFrame([tuple(k) for k in gate.pilot["calibration_inputs"]], schema=list(zip(INPUT_KEY, (
        logs.inputs.schema[c] for c in INPUT_KEY))), orient="row")
    recipes = [name for name in deployable() if POLICIES[name].replay]  # the paper's: fixed, z, midpoint
    # (name, policy, the inputs it is not evaluated on besides its own held-out pilot)
    policies = [*((name, policy_class(name)(), None) for name in recipes), ("risk", replay.FixedTau(float(gate.tau)), cal)]
    frames = []
    for name, policy, calibration_inputs in policies:
        use, _ = policy.applicable(logs)
        if use.inputs.height == 0:
            continue
        g = replay.gated_outcomes(use, policy, evictor=gate.pilot["evictor"]).filter(pl.col("budget") == budget)
        if calibration_inputs is not None:
            g = g.join(calibration_inputs, on=list(INPUT_KEY), how="anti")
        harm = metrics.on_frame(metrics.harm_rate, g, by=MATRIX_CELL, arm="gated").select(
            *MATRIX_CELL, "harm", pl.col("n").alias("n_inputs"))
        opened = metrics.on_frame(metrics.p_open, g, by=MATRIX_CELL).select(*MATRIX_CELL, "p_open")
        taus = g.group_by(MATRIX_CELL).agg(formulas.expr(formulas.group_tau()).alias("tau"))
        kept = metrics.on_frame(metrics.kept_kv, g, by=MATRIX_CELL).select(*MATRIX_CELL, "compression")
        frames.append(harm.join(opened, on=list(MATRIX_CELL)).join(taus, on=list(MATRIX_CELL))
                      .join(kept, on=list(MATRIX_CELL))
                      .with_columns(pl.lit(name).alias("policy")))
    return pl.concat(frames, how="vertical_relaxed").select("policy", *MATRIX_CELL, "tau", "n_inputs", "harm",
                                                            "p_open", "compression").sort(*MATRIX_CELL, "policy")
