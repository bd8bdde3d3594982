"""The paper's metrics as pure functions of the replay frames.

Inputs are the frames of :mod:`pagestats.replay`: ``gated_outcomes`` (one row per input,
evictor and budget, columns ``run_id, task, input_id, [pair_draw], model, context_length,
task_class, evictor, budget, n_tokens, drop, tau, gate_open, score_full, score_plain,
score_gated, n_kept_plain, n_kept_gated``) or the per-input ``gate`` frame. Functions
over many groups return polars frames sorted by their ``by`` columns; interval
arithmetic is delegated to :mod:`pagestats.stats`. The scaling relation (Table 25, Fig. 9,
Table 21) lives in :mod:`pagestats.scaling` and is re-exported here.

Conventions (one place, used by every function below)
-----------------------------------------------------
* ``A(1, x)``, the full-cache accuracy, is ``score_full`` (the budget-1.0 audit arm; the
  paper checks ``A_gated(1,x) = A_plain(1,x)`` on every row, App. A.7.1).
* Budget sweeps ``max_b`` and means over budgets use the rows with ``budget < 1`` (the
  eviction budgets); rows at ``budget == 1.0``, if logged, are the audit arm.
* A *unit* is one input under one evictor: ``(run_id, task, input_id, [pair_draw], evictor)``.
  Rates count units, so pooling over evictors (``evictor`` not in ``by``) counts each
  (input, evictor) pair once.
* A frame with several head-pair draws (``pair_draw``) must have ``pair_draw`` in ``by``;
  otherwise one input would be counted once per draw.
* An empty frame (or an empty selection) gives an empty result with the same columns.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults, stats
from pagestats.scaling import predict_band, scaling_fit, scaling_rows  # noqa: F401 (re-export)

__all__ = [
    "CELL",
    "TASK_CELL",
    "recovery_rate",
    "harm_rate",
    "recovery_indicator",
    "delta",
    "delta_bootstrap",
    "p_open",
    "kept_kv",
    "compression",
    "static_batching",
    "delta_of_f",
    "oracle_gap",
    "auc_by_signal",
    "scaling_rows",
    "scaling_fit",
    "predict_band",
]

#: A matrix cell of Table 2: (model, context, evictor).
CELL = ("model", "context_length", "evictor")
#: A cell broken down by task (Table 1, Table 12).
TASK_CELL = (*CELL, "task")
INPUT_KEY = ("run_id", "task", "input_id")
_ARMS = {"plain": ("score_plain", "n_kept_plain"), "gated": ("score_gated", "n_kept_gated")}


# --------------------------------------------------------------------------- checks


def _cols(frame: pl.DataFrame, cols, what: str) -> None:
    if not isinstance(frame, pl.DataFrame):
        raise TypeError(f"{what}: expected a polars DataFrame, got {type(frame).__name__}")
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: missing columns {missing}; frame has {frame.columns}")


def _input_key(frame: pl.DataFrame) -> list[str]:
    return [*INPUT_KEY, *(["pair_draw"] if "pair_draw" in frame.columns else [])]


def _unit_key(frame: pl.DataFrame) -> list[str]:
    return [*_input_key(frame), *(["evictor"] if "evictor" in frame.columns else [])]


def _uniq(*parts) -> list[str]:
    out: list[str] = []
    for part in parts:
        for c in part:
            if c not in out:
                out.append(c)
    return out


def _by(frame: pl.DataFrame, by, what: str) -> list[str]:
    by = [by] if isinstance(by, str) else list(by)
    _cols(frame, by, what)
    if "pair_draw" in frame.columns and "pair_draw" not in by and frame["pair_draw"].n_unique() > 1:
        raise ValueError(f"{what}: the frame has several pair_draw values; add 'pair_draw' to by")
    return by


def _arm(arm: str) -> tuple[str, str]:
    try:
        return _ARMS[arm]
    except KeyError:
        raise ValueError(f"arm must be 'plain' or 'gated', got {arm!r}") from None


def _outcome_rows(frame: pl.DataFrame, by, cols, what: str) -> tuple[pl.DataFrame, list[str]]:
    """Check an outcome frame, reject duplicate (unit, budget) rows, keep budgets b < 1."""
    by = _by(frame, by, what)
    _cols(frame, [*_unit_key(frame), "budget", *cols], what)
    key = [*_unit_key(frame), "budget"]
    if frame.select(key).is_duplicated().any():
        raise ValueError(f"{what}: duplicate rows for the same (input, evictor, budget)")
    return frame.filter(pl.col("budget") < 1.0), by


def _with_wilson(df: pl.DataFrame, name: str, confidence_level: float) -> pl.DataFrame:
    """Add ``name`` (= k/n), ``low`` and ``high`` from the ``k``/``n`` columns (Wilson)."""
    if df.height == 0:
        return df.with_columns(
            pl.lit(None, pl.Float64).alias(name), pl.lit(None, pl.Float64).alias("low"),
            pl.lit(None, pl.Float64).alias("high"),
        )
    iv = stats.wilson(df["k"].to_numpy(), df["n"].to_numpy(), confidence_level)
    return df.with_columns(
        pl.Series(name, np.atleast_1d(iv.estimate)),
        pl.Series("low", np.atleast_1d(iv.low)),
        pl.Series("high", np.atleast_1d(iv.high)),
    )


# --------------------------------------------------------------------------- rates


def recovery_rate(
    frame: pl.DataFrame,
    by=TASK_CELL,
    arm: str = "plain",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    threshold: float = defaults.RHO_THRESHOLD,
) -> pl.DataFrame:
    """Per-input recovery rate ρ (§3, Eq. 1; Table 1) with its Wilson interval.

    ``ρ = Pr_x[max_{b<1} A(b, x) > A(1, x)]``: the share of units for which some eviction
    budget strictly beats the full cache, ``A`` the ``arm``'s score (plain by default,
    as in Eq. 1).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (recovered units), ``n`` (units), ``rho``, ``low``,
        ``high`` (Wilson), ``dilution_prone`` (``rho >= threshold``, 0.05 pre-registered).
    """
    score, _ = _arm(arm)
    rows, by = _outcome_rows(frame, by, [score, "score_full"], "recovery_rate")
    units = rows.group_by(_uniq(by, _unit_key(rows))).agg(
        (pl.col(score).max() > pl.col("score_full").first()).alias("_rec")
    )
    out = units.group_by(by).agg(pl.col("_rec").sum().cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n"))
    out = _with_wilson(out.sort(by), "rho", confidence_level)
    return out.with_columns((pl.col("rho") >= threshold).alias("dilution_prone"))


def harm_rate(
    frame: pl.DataFrame,
    by=TASK_CELL,
    arm: str = "gated",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Fixed-budget harm rate ``Pr_x[A(b, x) < A_plain(1, x)]`` per budget (App. A.7.1, Table 27).

    Unlike r(x), this is a real event: at a fixed budget the gate can lose an answer the
    full cache had. Computed for every budget present, including a logged 1.0 audit row.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``budget``, ``k`` (harmed units), ``n``, ``harm``, ``low``, ``high``.
    """
    score, _ = _arm(arm)
    by = _by(frame, by, "harm_rate")
    _outcome_rows(frame, by, [score, "score_full"], "harm_rate")  # checks only
    keys = _uniq(by, ["budget"])
    out = frame.group_by(keys).agg(
        (pl.col(score) < pl.col("score_full")).sum().cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n")
    )
    return _with_wilson(out.sort(keys), "harm", confidence_level)


def recovery_indicator(frame: pl.DataFrame, arm: str = "gated", *, include_full: bool = True) -> pl.DataFrame:
    """Per-unit recovery indicator ``r(x) = sign(max_b A_arm(b, x) − A_plain(1, x))`` (App. A.7.1).

    With ``include_full=True`` (the paper) the sweep includes ``b = 1.0``, where the gated
    arm reproduces the full cache, so ``r >= 0`` by construction: r is an oracle-budget
    recovery measure, not a harm measure (see :func:`harm_rate`). ``include_full=False``
    takes the maximum over ``b < 1`` only, so ``r = −1`` becomes possible.

    Returns
    -------
    polars.DataFrame
        One row per unit: its key, ``model``, ``context_length``, ``task_class`` (those
        present), ``best`` (the maximum) and ``r`` (Int8 in {−1, 0, 1}).
    """
    score, _ = _arm(arm)
    rows, _ = _outcome_rows(frame, (), [score, "score_full"], "recovery_indicator")
    unit = _unit_key(rows)
    extra = [c for c in ("model", "context_length", "task_class") if c in rows.columns]
    best = pl.col(score).max()
    if include_full:
        best = pl.max_horizontal(best, pl.col("score_full").first())
    out = rows.group_by(unit).agg(*[pl.col(c).first() for c in extra], best.alias("best"),
                                  pl.col("score_full").first().alias("_full"))
    out = out.with_columns((pl.col("best") - pl.col("_full")).sign().cast(pl.Int8).alias("r")).drop("_full")
    return out.sort(unit)


def p_open(
    frame: pl.DataFrame,
    by=("model", "context_length"),
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Gate-open fraction ``p_open`` per group, with a Wilson interval (Tables 12, 22).

    A per-input property, independent of the budget and the evictor (App. A.6.2): each
    input (and pair draw) is counted once per group. Works on the gate frame or on gated
    outcomes.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (open inputs), ``n`` (inputs), ``p_open``, ``low``, ``high``.
    """
    by = _by(frame, by, "p_open")
    key = _input_key(frame)
    _cols(frame, [*key, "gate_open"], "p_open")
    inputs = frame.select(_uniq(by, key, ["gate_open"])).unique()
    if inputs.select(_uniq(by, key)).is_duplicated().any():
        raise ValueError("p_open: gate_open differs between rows of the same input")
    out = inputs.group_by(by).agg(
        pl.col("gate_open").sum().cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n")
    )
    return _with_wilson(out.sort(by), "p_open", confidence_level)


def kept_kv(frame: pl.DataFrame, by=CELL, arm: str = "gated") -> pl.DataFrame:
    """Achieved kept-KV and compression of an arm (App. A.6.2, Table 22).

    ``kept_kv`` = mean over rows (inputs × budgets b < 1 in the group) of
    ``n_kept / n_tokens``; put ``budget`` in ``by`` for one budget, leave it out for the
    paper's "grid mean" over the budget grid. ``compression = 1 / kept_kv``.
    ``kept_kv_open`` is the same mean over gate-open rows only (Table 23's ``k_open``).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``kept_kv``, ``compression``, ``kept_kv_open``, ``n_rows``, ``n_open_rows``.
    """
    _, kept = _arm(arm)
    rows, by = _outcome_rows(frame, by, [kept, "n_tokens", "gate_open"], "kept_kv")
    if (rows["n_tokens"] <= 0).any():
        raise ValueError("kept_kv: n_tokens must be positive")
    frac = pl.col(kept) / pl.col("n_tokens")
    out = rows.group_by(by).agg(
        frac.mean().alias("kept_kv"),
        frac.filter(pl.col("gate_open")).mean().alias("kept_kv_open"),
        pl.len().cast(pl.Int64).alias("n_rows"),
        pl.col("gate_open").sum().cast(pl.Int64).alias("n_open_rows"),
    )
    out = out.with_columns((1.0 / pl.col("kept_kv")).alias("compression"))
    return out.select(*by, "kept_kv", "compression", "kept_kv_open", "n_rows", "n_open_rows").sort(by)


def compression(frame: pl.DataFrame, by=CELL, arm: str = "gated") -> pl.DataFrame:
    """Achieved compression ``1 / kept-KV`` (Table 22): :func:`kept_kv`'s by-columns,
    ``compression`` and ``kept_kv``."""
    return kept_kv(frame, by, arm).select(*([by] if isinstance(by, str) else by), "compression", "kept_kv")


def static_batching(p_open, kept_open, batch_sizes=(1, 2, 4, 8, 16, 32)) -> pl.DataFrame:
    """Compression under static batch provisioning (App. A.6.2, Table 23).

    A batch of ``B`` sequences is provisioned for its largest resident cache: one
    gate-closed sequence forces the whole batch to the full cache.

    Parameters
    ----------
    p_open, kept_open : float or array_like
        Gate-open fraction and mean kept-KV fraction of gate-open inputs (Table 22);
        arrays are paired element-wise (one entry per model).
    batch_sizes : sequence of int

    Returns
    -------
    polars.DataFrame
        ``p_open``, ``kept_open``, ``batch_size``, ``p_all_open``, ``provisioned``
        (expected provisioned fraction of the full cache) and ``compression``.

    Notes
    -----
    With independent gate decisions, every sequence of the batch is provisioned at the
    full cache (fraction 1) unless all ``B`` gates open, which happens with probability
    ``p_open^B``; then the batch is provisioned at ``kept_open``:
    ``provisioned(B) = (1 − p_open^B) + p_open^B · kept_open`` and
    ``compression(B) = 1 / provisioned(B)`` (expected memory, not expected ratio). At
    ``B = 1`` this is Table 22's realized compression ``1 / ((1 − p_open) + p_open·k_open)``;
    as ``B`` grows it decays to 1× (``p_open = 0.75``, ``k_open = 0.0625``: 3.37× at
    ``B = 1``, 1.01× at ``B = 16``).
    """
    p = np.atleast_1d(np.asarray(p_open, dtype=np.float64))
    k = np.atleast_1d(np.asarray(kept_open, dtype=np.float64))
    p, k = np.broadcast_arrays(p, k)
    b = np.asarray(batch_sizes)
    if b.ndim != 1 or b.size == 0 or not np.issubdtype(b.dtype, np.integer) or np.any(b < 1):
        raise ValueError("batch_sizes must be a non-empty sequence of positive integers")
    for name, v in (("p_open", p), ("kept_open", k)):
        if not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"{name} must lie in [0, 1]")
    pp, bb = np.meshgrid(p, b, indexing="ij")
    kk = np.broadcast_to(k[:, None], pp.shape)
    all_open = pp**bb
    provisioned = (1.0 - all_open) + all_open * kk
    return pl.DataFrame(
        {
            "p_open": pp.ravel(),
            "kept_open": kk.ravel(),
            "batch_size": bb.ravel().astype(np.int64),
            "p_all_open": all_open.ravel(),
            "provisioned": provisioned.ravel(),
            "compression": 1.0 / provisioned.ravel(),
        }
    )


# --------------------------------------------------------------------------- gating Δ


def delta(frame: pl.DataFrame, by=CELL) -> pl.DataFrame:
    """Gating Δ: mean over inputs and budgets b < 1 of ``score_gated − score_plain`` (Table 2).

    Add ``task`` to ``by`` for the per-task breakdown (Table 12).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``n_inputs`` (units), ``n_rows``.
    """
    rows, by = _outcome_rows(frame, by, ["score_gated", "score_plain"], "delta")
    out = rows.group_by(by).agg(
        (pl.col("score_gated") - pl.col("score_plain")).mean().alias("delta"),
        pl.struct(_unit_key(rows)).n_unique().cast(pl.Int64).alias("n_inputs"),
        pl.len().cast(pl.Int64).alias("n_rows"),
    )
    return out.sort(by)


def delta_bootstrap(
    frame: pl.DataFrame,
    by=CELL,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    q: float = defaults.FDR_Q,
    shared_inputs: bool = False,
) -> pl.DataFrame:
    """Δ per cell with cluster-bootstrap intervals and BH-adjusted p-values (Table 28).

    Each group of ``by`` is a cell; its units (inputs) carry their per-budget paired
    differences ``score_gated − score_plain`` over budgets b < 1 into
    :func:`pagestats.stats.cluster_bootstrap` (cells in ``by`` order, one ``rng``).
    Benjamini–Hochberg at ``q`` runs across all cells of the call (:func:`pagestats.stats.bh`).
    ``shared_inputs=True`` resamples the inputs jointly across cells (see
    :func:`~pagestats.stats.cluster_bootstrap`); every cell must then hold the same inputs.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``low``, ``high``, ``p_value``, ``p_adjusted``,
        ``rejected``, ``n_inputs``, ``n_budgets``, ``n_boot``.

    Raises
    ------
    ValueError
        A cell whose units do not all carry the same set of budgets (the bootstrap needs
        a balanced grid so that Δ is the mean of per-input means).
    """
    rows, by = _outcome_rows(frame, by, ["score_gated", "score_plain"], "delta_bootstrap")
    unit = _unit_key(rows)
    rows = rows.with_columns((pl.col("score_gated") - pl.col("score_plain")).alias("_d")).sort(
        _uniq(by, unit, ["budget"])
    )
    keys, cells, inputs = [], [], []
    for part in rows.partition_by(by, maintain_order=True):
        n_units = part.select(pl.struct(unit).n_unique()).item()
        n_budgets = part["budget"].n_unique()
        per_unit = part.group_by(unit).agg(pl.col("budget").sort())
        if part.height != n_units * n_budgets or per_unit["budget"].n_unique() != 1:
            label = part.select(by).row(0, named=True)
            raise ValueError(f"delta_bootstrap: cell {label} has units with different budget sets")
        keys.append(part.select(by).head(1))
        cells.append(part["_d"].to_numpy().reshape(n_units, n_budgets))
        if shared_inputs:
            inputs.append(part.select(_input_key(part)).unique(maintain_order=True))
    if shared_inputs and any(not x.equals(inputs[0]) for x in inputs[1:]):
        raise ValueError("delta_bootstrap: shared_inputs=True but the cells do not hold the same inputs")
    if not cells:
        schema = {**{c: frame.schema[c] for c in by}, "delta": pl.Float64, "low": pl.Float64,
                  "high": pl.Float64, "p_value": pl.Float64, "p_adjusted": pl.Float64,
                  "rejected": pl.Boolean, "n_inputs": pl.Int64, "n_budgets": pl.Int64, "n_boot": pl.Int64}
        return pl.DataFrame(schema=schema)
    res = stats.cluster_bootstrap(
        cells, rng=rng, n_boot=n_boot, confidence_level=confidence_level, shared_inputs=shared_inputs
    )
    adj = stats.bh(res.p_value, q=q)
    return pl.concat(keys).with_columns(
        pl.Series("delta", res.estimate),
        pl.Series("low", res.low),
        pl.Series("high", res.high),
        pl.Series("p_value", res.p_value),
        pl.Series("p_adjusted", adj.adjusted),
        pl.Series("rejected", adj.rejected),
        pl.Series("n_inputs", res.n_inputs),
        pl.Series("n_budgets", res.n_budgets),
        pl.lit(res.n_boot, pl.Int64).alias("n_boot"),
    )


def delta_of_f(delta_capacity, delta_rest, f):
    """Δ as a function of the capacity-bound share ``f`` of the workload (§4.1, Fig. 7).

    ``Δ(f) = f·Δ_capacity + (1 − f)·Δ_rest``, vectorised (NumPy broadcasting) over all
    three arguments; per-task accuracy is additive under reweighting, so this is exact
    for a workload mixing the two classes in proportion ``f``.
    """
    f = np.asarray(f, dtype=np.float64)
    if not np.all((f >= 0) & (f <= 1)):
        raise ValueError("f must lie in [0, 1]")
    out = f * np.asarray(delta_capacity, dtype=np.float64) + (1.0 - f) * np.asarray(delta_rest, dtype=np.float64)
    return out.item() if out.ndim == 0 else out


def oracle_gap(frame_gate_policy: pl.DataFrame, frame_oracle: pl.DataFrame, by=CELL) -> pl.DataFrame:
    """Δ of a gate policy minus Δ of the task-label oracle per cell (§4.1, App. A.4.3, Table 14).

    Both frames are gated outcomes of the same logs, under the policy and under
    :class:`pagestats.policies.TaskOracle` (close on capacity-bound tasks, open elsewhere).
    A gap of exactly 0 means the gate reproduced the oracle's decisions; positive needs
    within-task per-input variation.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta_policy``, ``delta_oracle``, ``gap``, ``n_inputs``.
    """
    a = delta(frame_gate_policy, by).rename({"delta": "delta_policy"})
    b = delta(frame_oracle, by).rename({"delta": "delta_oracle"})
    by = [by] if isinstance(by, str) else list(by)
    if a.height != b.height or a.join(b, on=by, how="anti", nulls_equal=True).height:
        raise ValueError("oracle_gap: the two frames do not cover the same cells")
    out = a.join(b.select(*by, "delta_oracle"), on=by, nulls_equal=True)
    return out.select(*by, "delta_policy", "delta_oracle", (pl.col("delta_policy") - pl.col("delta_oracle")).alias("gap"),
                      "n_inputs").sort(by)


# --------------------------------------------------------------------------- AUC


def auc_by_signal(
    frame: pl.DataFrame,
    statistic: str = "drop",
    by=("model", "context_length"),
    *,
    capacity_tasks=None,
    dilution_tasks=None,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Per-input AUC of capacity-bound vs dilution-prone inputs by a statistic (§3; Tables 5–6).

    Each input (and pair draw) counts once. Classes come from ``task_class``, or from
    ``capacity_tasks`` (e.g. ``["niah_multikey_3"]``) when given; ``dilution_tasks``
    restricts the other class (Table 6: NIAH-MK3 vs the pooled dilution-prone tasks).
    Orientation as :func:`pagestats.stats.auc`: capacity-bound inputs should have the
    LOWER statistic, AUC = Pr[s(dilution) > s(capacity)] + ½·Pr[tie].

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``auc``, ``low``, ``high`` (DeLong), ``n_capacity``,
        ``n_dilution``; ``auc`` and its interval are null in a group lacking either class.
    """
    by = _by(frame, by, "auc_by_signal")
    key = _input_key(frame)
    need = [*key, statistic, *([] if capacity_tasks is not None else ["task_class"])]
    _cols(frame, need, "auc_by_signal")
    inputs = frame.select(_uniq(by, need)).unique(subset=_uniq(by, key), keep="first", maintain_order=True)
    if capacity_tasks is not None:
        cap = pl.col("task").is_in(list(capacity_tasks))
    else:
        cap = pl.col("task_class") == defaults.CAPACITY_BOUND
    inputs = inputs.with_columns(cap.alias("_cap"))
    if dilution_tasks is not None:
        inputs = inputs.filter(pl.col("_cap") | pl.col("task").is_in(list(dilution_tasks)))
    rows = []
    for part in inputs.sort(by).partition_by(by, maintain_order=True) if inputs.height else []:
        lab = part["_cap"].to_numpy().astype(bool)
        row = part.select(by).row(0, named=True)
        row.update(n_capacity=int(lab.sum()), n_dilution=int((~lab).sum()), auc=None, low=None, high=None)
        if lab.any() and (~lab).any():
            r = stats.auc(part[statistic].to_numpy(), lab, confidence_level)
            row.update(auc=r.estimate, low=r.low, high=r.high)
        rows.append(row)
    schema = {**{c: frame.schema[c] for c in by}, "auc": pl.Float64, "low": pl.Float64, "high": pl.Float64,
              "n_capacity": pl.Int64, "n_dilution": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
