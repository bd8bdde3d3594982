"""The paper reproduced from its own logs: every printed value of the paper beside ours (issue 40 §2).

The paper's values are data, typed from the paper into :data:`PAPER_VALUES_FILE`
(``paper_values.csv`` beside this module: one row per printed number, with the table, section or
figure that prints it, its printed precision, and, for pooled numbers, the cells it pools). This
module never computes them; it computes *our* value of each row with the paper's recipe for that
table, from the gated outcomes of the logs given (:func:`pagestats.replay.gated_outcomes` at the
paper's τ = 0.07, the authors' replay: gated = plain where D ≥ τ, else the full-KV outcome), and
says whether the two agree.

A paper row whose cells, tasks or budgets the logs lack is kept, with no value and the status
``not-in-logs``: a row is never dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from pagestats import metrics
from pagestats.core import defaults, formulas
from pagestats.metrics.matched import FRONTIER_TOL, frontier_accuracy

__all__ = ["COLUMNS", "PAPER_VALUES_FILE", "INTERVAL_TOLERANCE", "QUANTITIES", "STATUSES", "conformance_table",
           "paper_values"]

#: The paper's printed values (typed from the paper; see the module docstring).
PAPER_VALUES_FILE = Path(__file__).with_name("paper_values.csv")

#: The columns of the conformance table, in order (``tables/conformance.csv``).
COLUMNS = ("item", "quantity", "model", "context_length", "evictor", "task", "budget", "paper_value", "value",
           "difference", "status")

#: ``match``: equal at the paper's printed precision (intervals: within :data:`INTERVAL_TOLERANCE`);
#: ``differs``: not; ``not-in-logs``: the files behind the paper's number are not in the logs given.
STATUSES = ("match", "differs", "not-in-logs")

#: The recipes, by the ``quantity`` of a paper row (spelled out in :func:`conformance_table`'s Notes).
QUANTITIES = ("plain", "gated", "full", "delta", "grand_mean_delta", "cells_rest_identical", "gated_min_over_budgets",
              "gated_max_over_budgets", "p_open", "kept_kv_plain", "compression", "mean_compression",
              "batch_compression", "mean_batch_compression", "harm_plain", "harm_gated", "harm_ratio",
              "crossover_kept_kv", "max_matched_gain", "identical_evicting_rows", "evicting_rows",
              "oracle_grand_mean_delta", "cells_oracle_equal", "cells_beat_oracle", "cells_lose_to_oracle",
              "max_oracle_gap", "min_oracle_gap", "rho", "recovered_inputs", "inputs", "cells_ci_exclude_zero",
              "min_ci_low")

#: How far an interval bound may be from the paper's and still match (issue 40 §2).
INTERVAL_TOLERANCE = 0.005

#: Quantities that are an interval's bound: they match within :data:`INTERVAL_TOLERANCE`.
_BOUNDS = ("min_ci_low",)

_SEP = ";"
_READ = ["run_id", "task", "input_id", "model", "context_length", "evictor", "budget", "n_tokens", "gate_open",
         "score_full", "score_plain", "score_gated", "n_kept_plain", "n_kept_gated"]


class _NotInLogs(Exception):
    """The logs lack a cell, task or budget (or a column's values) that a paper row needs."""


def paper_values(path: str | Path | None = None) -> pl.DataFrame:
    """The paper's printed values: :data:`PAPER_VALUES_FILE` (or ``path``) as a frame of strings
    (``paper_value`` and the interval bounds as printed; ``decimals`` the printed precision)."""
    frame = pl.read_csv(path or PAPER_VALUES_FILE, infer_schema=False)
    missing = [c for c in ("item", "quantity", "model", "context_length", "evictor", "task", "budget", "paper_value",
                           "ci_low", "ci_high", "decimals", "source", "cells", "batch_size") if c not in frame.columns]
    if missing:
        raise ValueError(f"paper values: missing columns {', '.join(missing)}")
    return frame.with_columns(pl.all().fill_null(""))


def conformance_table(gated: pl.DataFrame, *, rng: np.random.Generator, paper: pl.DataFrame | None = None,
                      n_boot: int = defaults.N_BOOTSTRAP) -> pl.DataFrame:
    """Every printed value of the paper beside ours, with the paper's recipe for its table.

    Parameters
    ----------
    gated : polars.DataFrame
        Gated outcomes at the paper's fixed τ (:func:`pagestats.replay.gated_outcomes` with
        ``FixedTau(0.07)``): the authors' replay, never a stored gated column. One input draw per
        (model, context), as the paper's tables (the report passes its first draw); a second draw's
        inputs would be pooled with the first.
    rng : numpy.random.Generator
        For the cluster bootstrap of the interval rows (Table 28).
    paper : polars.DataFrame, optional
        The paper's values (default :func:`paper_values`).
    n_boot : int
        Bootstrap replicates (the paper: 10,000).

    Returns
    -------
    polars.DataFrame
        Exactly :data:`COLUMNS`, one row per paper value, and one more per printed interval bound
        (``quantity`` "delta 95% CI low" / "high"), in the order of the paper's file. ``budget`` is
        the budget set as the paper's recipe reads it ("b<1": every eviction budget logged;
        "all": with the full cache; numbers joined by ";"; "M=128": an absolute budget);
        ``value`` is null and ``status`` ``not-in-logs`` where the logs lack the row's cells,
        tasks or budgets; ``difference`` = value − paper_value.

    Notes
    -----
    The recipes, per ``quantity`` (each over the row's cells, tasks and budgets):

    * ``plain``, ``gated``, ``full``: mean score of the arm over inputs × budgets (Table 2: the
      four-task suite, b < 1; Table 13 and the showcase: one budget);
    * ``delta``: mean of gated − plain over inputs × budgets (:func:`pagestats.metrics.accuracy`); a
      printed interval is the cluster bootstrap over inputs of Table 28
      (:func:`pagestats.metrics.delta_bootstrap`: the inputs resampled with their per-budget
      paired differences, 2.5–97.5 percentiles);
    * ``grand_mean_delta``: the mean over the listed cells of each cell's Δ (Table 12);
      ``cells_rest_identical``: how many of them open the gate on every input of the row's tasks
      (the paper's † rows, where gated ≡ plain);
    * ``gated_min_over_budgets`` / ``gated_max_over_budgets``: the extremes over budgets of the
      gated accuracy (Table 13);
    * ``p_open``: share of the inputs whose gate opens (:func:`pagestats.metrics.p_open`);
    * ``kept_kv_plain``: mean n_kept / n_tokens of plain eviction over inputs × budgets ("grid mean"
      over b < 1, Table 22); ``compression``: 1 / the gated arm's mean kept fraction at the budget
      (Table 22); ``batch_compression``: expected compression of a batch of ``batch_size`` under
      static provisioning (:func:`pagestats.metrics.static_batching`, Table 23); the ``mean_``
      forms average a pooled row's cells;
    * ``harm_plain``, ``harm_gated``: harmed rows / rows at the budget, the rows of every listed
      cell pooled (:func:`pagestats.metrics.harm_rate`, Table 27: N = 500 per task and budget);
      ``harm_ratio``: their quotient;
    * ``crossover_kept_kv`` (Fig. 4): the smallest gated kept KV over b < 1 from which on every gated
      point scores at least plain eviction's frontier at the same kept KV
      (:func:`pagestats.metrics.frontier_accuracy` over every logged plain budget, the full cache
      included); ``max_matched_gain``: the largest gated − frontier gap of the listed cells;
    * ``rho``, ``recovered_inputs``, ``inputs``: Table 1's per-input recovery rate ρ = Pr[max_{b<1}
      A_plain(b, x) > A(1, x)] (Eq. 1) over the listed cells' inputs pooled, with its Wilson interval
      (:func:`pagestats.metrics.recovery_rate`);
    * ``cells_ci_exclude_zero``, ``min_ci_low``: over the listed cells, how many of Table 28's
      cluster-bootstrap intervals of Δ exclude zero, and the smallest lower bound (a bound: it
      matches within :data:`INTERVAL_TOLERANCE`);
    * Table 14's task-label oracle (closed on NIAH-MK3, open elsewhere; its gated arm the full-KV
      outcome where closed): ``oracle_grand_mean_delta`` (the mean of the cells' oracle Δ), the
      gaps Δ(gate) − Δ(oracle) (``max_oracle_gap``, ``min_oracle_gap``, ``cells_beat_oracle``,
      ``cells_lose_to_oracle``) and ``cells_oracle_equal`` (the gate decides as the oracle on every input);
    * ``identical_evicting_rows`` / ``evicting_rows`` (evictor "A=B"): evicting rows of A whose plain
      score equals B's on the same input and budget, and the rows compared (the Qwen2.5-14B audit).

    Cells are named as the imported runs name them (:mod:`pagestats.io.imports.names`): the paper's
    StreamingLLM, which keeps 36 positions at every b < 1, is ``streamingllm-fixed``.
    The evictors of a (model, context) are compared on the same inputs, as in Table 2
    (:func:`pagestats.metrics.equal_inputs`). A match is equality at the printed precision:
    |value − paper| ≤ half a unit of its last printed digit; an interval bound matches within
    :data:`INTERVAL_TOLERANCE`.

    References
    ----------
    PAGE §4 and Table 1 (the pooled NIAH-MK3 contrast), §4.1 and Table 2 (with Table 28's intervals),
    App. A.4.1 and Table 12, Table 13, Table 16 and App. A.6.3, Table 14 and App. A.4.3, Table 19, App. A.6.2
    and Tables 22–23, App. A.7.1 and Table 27, Fig. 4, Fig. 3 (the Mistral NIAH-MK3 showcase), Table 17's note
    on the Qwen2.5-14B H2O cell.
    """
    paper = paper_values() if paper is None else paper
    # the rows of the paper's models only (on other logs nothing is left, and nothing is copied twice)
    pooled = {spec.split("@")[0] for cells in paper["cells"] if cells for spec in cells.split(_SEP)}
    models = set(paper["model"]) | pooled
    rows = gated.select([c for c in _READ if c in gated.columns]).filter(pl.col("model").is_in(sorted(models)))
    rows, _ = metrics.equal_inputs(rows)
    out = []
    for row in paper.iter_rows(named=True):
        try:
            value = _value(rows, row, rng=rng, n_boot=n_boot)
        except _NotInLogs:
            value = None
        bounds = [(f"{row['quantity']} 95% CI {side}", row[col])
                  for side, col in (("low", "ci_low"), ("high", "ci_high")) if row[col] != ""]
        interval = {}
        if bounds and value is not None:
            interval = _interval(rows, row, rng=rng, n_boot=n_boot)
        tolerance = INTERVAL_TOLERANCE if row["quantity"] in _BOUNDS else None  # a printed interval bound
        out.append(_result(row, row["quantity"], row["paper_value"], value, tolerance))
        for (name, printed), side in zip(bounds, ("low", "high")):
            out.append(_result(row, name, printed, interval.get(side), INTERVAL_TOLERANCE))
    schema = {"item": pl.String, "quantity": pl.String, "model": pl.String, "context_length": pl.Int64,
              "evictor": pl.String, "task": pl.String, "budget": pl.String, "paper_value": pl.Float64,
              "value": pl.Float64, "difference": pl.Float64, "status": pl.String}
    return pl.DataFrame(out, schema=schema, orient="row").select(COLUMNS)


def _result(row: dict, quantity: str, printed: str, value: float | None, tolerance: float | None) -> tuple:
    paper_value = float(printed)
    if value is None:
        status, difference = "not-in-logs", None
    else:
        difference = value - paper_value
        # equal at the printed precision: within half a unit of the last printed digit (float noise aside)
        limit = tolerance if tolerance is not None else 0.5 * 10.0 ** -int(row["decimals"]) + 1e-9
        status = "match" if abs(difference) <= limit else "differs"
    ctx = int(row["context_length"]) if row["context_length"] != "" else None
    return (row["item"], quantity, row["model"], ctx, row["evictor"], row["task"], row["budget"], paper_value,
            value, difference, status)


# --------------------------------------------------------------------------- selection


def _cells(row: dict) -> list[tuple[str, int, str]]:
    """(model, context, evictor) of every cell the row reads (its ``cells`` list, else its own cell)."""
    if row["cells"]:
        cells = []
        for spec in row["cells"].split(_SEP):
            model, ctx, evictor = spec.split("@")
            cells.append((model, int(ctx), evictor))
        return cells
    return [(row["model"], int(row["context_length"]), e) for e in row["evictor"].split("=")]


def _budgets(spec: str, context_length: int) -> list[float] | str | None:
    """The row's budget set: a list, "b<1" / "all" (every logged budget below 1 / every one), or None.

    "M=128" is an absolute budget of 128 tokens (Table 19), which an imported run records as the
    nominal b = M / context length (docs/IMPORT.md)."""
    if spec in ("", "b<1", "all"):
        return spec or None
    return [float(b[2:]) / context_length if b.startswith("M=") else float(b) for b in spec.split(_SEP)]


def _select(rows: pl.DataFrame, row: dict, cell: tuple[str, int, str], *, full: bool = False) -> pl.DataFrame:
    """The rows of one cell, task set and budget set; :class:`_NotInLogs` when the logs lack any of them.

    ``full``: keep the b = 1 rows beside a "b<1" set (the frontier reads the full cache)."""
    model, ctx, evictor = cell
    part = rows.filter((pl.col("model") == model) & (pl.col("context_length") == ctx) & (pl.col("evictor") == evictor))
    tasks = row["task"].split(_SEP) if row["task"] else None
    if tasks is not None:
        part = part.filter(pl.col("task").is_in(tasks))
    if part.height == 0:
        raise _NotInLogs
    logged = part.group_by(pl.col("task").cast(pl.String)).agg(pl.col("budget").unique())
    if tasks is not None and set(logged["task"]) != set(tasks):
        raise _NotInLogs
    budgets = _budgets(row["budget"], ctx)
    if isinstance(budgets, list):
        for have in logged["budget"]:
            if not set(budgets) <= set(have):
                raise _NotInLogs
        return part.filter(pl.col("budget").is_in(budgets))
    if budgets == "b<1":
        if not all(any(b < 1 for b in have) for have in logged["budget"]):
            raise _NotInLogs
        return part if full else part.filter(formulas.EVICTED)
    return part


def _need(frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """The frame, or :class:`_NotInLogs` when a column the recipe reads is unknown on some row
    (e.g. the full-KV outcome of a gate-open input in a file without b = 1 rows)."""
    if any(frame[c].null_count() for c in columns):
        raise _NotInLogs
    return frame


# --------------------------------------------------------------------------- recipes


def _value(rows: pl.DataFrame, row: dict, *, rng: np.random.Generator, n_boot: int) -> float:
    q = row["quantity"]
    cells = _cells(row)
    if q in ("identical_evicting_rows", "evicting_rows"):
        return _audit(rows, row, cells, q)
    if q in ("cells_ci_exclude_zero", "min_ci_low"):
        return _intervals(rows, row, cells, q, rng=rng, n_boot=n_boot)
    if q in ("grand_mean_delta", "cells_rest_identical", "mean_compression", "mean_batch_compression",
             "max_matched_gain", "harm_plain", "harm_gated", "harm_ratio", *_ORACLE, "rho", "recovered_inputs",
             "inputs"):
        return _pooled(rows, row, cells, q)
    (cell,) = cells
    return _cell_value(rows, row, cell, q)


def _cell_value(rows: pl.DataFrame, row: dict, cell: tuple[str, int, str], q: str) -> float:
    budgets = _budgets(row["budget"], cell[1])
    include_full = budgets == "all" or (isinstance(budgets, list) and 1.0 in budgets)
    if q in ("plain", "gated", "full", "delta"):
        # over exactly the row's budgets (metrics.accuracy reads every budget present, b = 1 included)
        sel = _need(_select(rows, row, cell), "score_full" if q == "full" else "score_gated")
        return _one(metrics.accuracy, sel, "delta" if q == "delta" else f"acc_{q}")
    if q in ("gated_min_over_budgets", "gated_max_over_budgets"):
        sel = _need(_select(rows, row, cell), "score_gated")
        acc = metrics.on_frame(metrics.accuracy, sel, by=["model", "budget"])["acc_gated"]
        return float(acc.min() if q.startswith("gated_min") else acc.max())
    if q == "p_open":
        return _one(metrics.p_open, _select(rows, row, cell), "p_open")
    if q == "kept_kv_plain":
        sel = _select(rows, row, cell)
        return _one(metrics.kept_kv, sel, "kept_kv", arm="plain", include_full=include_full)
    if q == "compression":
        return _one(metrics.kept_kv, _select(rows, row, cell), "compression", arm="gated")
    if q == "batch_compression":
        return _batch_compression(_select(rows, row, cell), int(row["batch_size"]))
    if q == "crossover_kept_kv":
        return _frontier(_select(rows, row, cell, full=True))[0]
    raise ValueError(f"paper values: no recipe for the quantity {q!r} ({row['item']})")


def _one(metric, rows: pl.DataFrame, column: str, **kwargs) -> float:
    """``column`` of ``metric`` over ``rows``, one model's: the value of a row of the paper."""
    return float(metrics.on_frame(metric, rows, by=["model"], **kwargs)[column][0])


def _pooled(rows: pl.DataFrame, row: dict, cells: list, q: str) -> float:
    parts = [_select(rows, row, cell, full=q == "max_matched_gain") for cell in cells]  # every cell or none
    if q == "grand_mean_delta":
        return float(np.mean([_one(metrics.accuracy, _need(p, "score_gated"), "delta") for p in parts]))
    if q == "cells_rest_identical":
        return float(sum(bool(p["gate_open"].all()) for p in parts))
    if q == "mean_compression":
        return float(np.mean([_one(metrics.kept_kv, p, "compression", arm="gated") for p in parts]))
    if q == "mean_batch_compression":
        return float(np.mean([_batch_compression(p, int(row["batch_size"])) for p in parts]))
    if q == "max_matched_gain":
        return float(max(_frontier(p)[1] for p in parts))
    if q in _ORACLE:
        return _oracle(parts, q)
    if q in ("rho", "recovered_inputs", "inputs"):
        rec = _recovery(parts)
        return float({"rho": rec["rho"], "recovered_inputs": rec["k"], "inputs": rec["n"]}[q])
    pooled = _need(pl.concat(parts, how="vertical_relaxed").with_columns(pl.col("task").cast(pl.String)), "score_full")
    harm = {arm: metrics.on_frame(metrics.harm_rate, pooled, by=["task"], arm=arm) for arm in ("plain", "gated")}
    k = {arm: int(h["k"].sum()) for arm, h in harm.items()}
    n = int(harm["plain"]["n"].sum())
    if q == "harm_ratio":
        return k["plain"] / k["gated"] if k["gated"] else float("inf")
    return k[q.removeprefix("harm_")] / n


_ORACLE = ("oracle_grand_mean_delta", "cells_oracle_equal", "cells_beat_oracle", "cells_lose_to_oracle",
           "max_oracle_gap", "min_oracle_gap")


def _oracle(parts: list[pl.DataFrame], q: str) -> float:
    """Table 14 over the listed cells: the task-label oracle closes on the anchor task (NIAH-MK3,
    :data:`pagestats.core.defaults.ANCHOR_TASKS`) and opens on every other; gap = Δ(gate) − Δ(oracle)."""
    deltas, gaps, equal = [], [], []
    for p in parts:
        closed = pl.col("task").is_in(list(defaults.ANCHOR_TASKS))
        arm = pl.when(closed).then(pl.col("score_full")).otherwise(pl.col("score_plain"))
        oracle = p.with_columns((~closed).alias("gate_open"), arm.alias("score_gated"))
        d_oracle = _one(metrics.accuracy, _need(oracle, "score_gated"), "delta")
        d_gate = _one(metrics.accuracy, _need(p, "score_gated"), "delta")
        deltas.append(d_oracle)
        gaps.append(d_gate - d_oracle)
        equal.append(bool((p["gate_open"] == oracle["gate_open"]).all()))
    gaps = np.asarray(gaps)
    tol = 1e-12  # the same decisions give the same Δ, up to the order of a float sum
    return {"oracle_grand_mean_delta": float(np.mean(deltas)), "cells_oracle_equal": float(sum(equal)),
            "cells_beat_oracle": float((gaps > tol).sum()), "cells_lose_to_oracle": float((gaps < -tol).sum()),
            "max_oracle_gap": float(gaps.max()), "min_oracle_gap": float(gaps.min())}[q]


def _recovery(parts: list[pl.DataFrame]) -> dict:
    """Table 1's pooled contrast: recovered inputs k of n, ρ and its Wilson interval, the inputs of every
    listed cell pooled (:func:`pagestats.metrics.recovery_rate`, the plain arm)."""
    pooled = _need(pl.concat(parts, how="vertical_relaxed").with_columns(pl.col("task").cast(pl.String)), "score_full")
    rec = metrics.on_frame(metrics.recovery_rate, pooled.with_columns(pl.lit("pooled").alias("_cells")), by=["_cells"])
    return rec.row(0, named=True)


def _batch_compression(sel: pl.DataFrame, batch_size: int) -> float:
    kept = metrics.on_frame(metrics.kept_kv, sel, by=["model"], arm="gated")
    p = _one(metrics.p_open, sel, "p_open")
    k_open = kept["kept_kv_open"][0]
    k_open = 1.0 if k_open is None else float(k_open)  # no open input: the full cache
    return float(metrics.static_batching(p, k_open, [batch_size])["compression"][0])


def _frontier(sel: pl.DataFrame) -> tuple[float, float]:
    """(crossover kept KV, largest gated − frontier gap) of one cell (Fig. 4).

    Plain eviction's points are (mean n_kept_plain / n_tokens, accuracy) at every logged budget;
    the gated arm's at each b < 1. The crossover is the smallest gated kept KV from which on no
    gated point falls below the frontier (NaN when the last one does)."""
    sel = _need(sel, "score_full", "score_gated").sort("budget", "run_id", "task", "input_id")
    # NumPy means over each budget's rows in key order: a polars group-by mean sums in thread order,
    # which moved the crossover's last bit from one run to the next.
    cols = {"k_p": sel["n_kept_plain"] / sel["n_tokens"], "a_p": sel["score_plain"],
            "k_g": sel["n_kept_gated"] / sel["n_tokens"], "a_g": sel["score_gated"]}
    budgets, starts = np.unique(sel["budget"].to_numpy(), return_index=True)
    bounds = list(starts[1:]) + [sel.height]
    pts = pl.DataFrame({"budget": budgets, **{k: [float(np.mean(v.to_numpy()[i:j])) for i, j in zip(starts, bounds)]
                                              for k, v in cols.items()}})
    gated = pts.filter(pl.col("budget") < 1).sort("k_g")
    frontier = frontier_accuracy(pts["k_p"].to_numpy()[None], pts["a_p"].to_numpy()[None],
                                 gated["k_g"].to_numpy()[None])[0]
    gap = gated["a_g"].to_numpy() - frontier
    ahead = gap >= -FRONTIER_TOL
    crossing = [i for i in range(len(gap)) if ahead[i:].all()]
    crossover = float(gated["k_g"][crossing[0]]) if crossing else float("nan")
    return crossover, float(gap.max())


def _audit(rows: pl.DataFrame, row: dict, cells: list, q: str) -> float:
    """Evicting rows of evictor A whose plain score equals B's on the same input and budget (A=B)."""
    a, b = (_select(rows, row, cell).select("run_id", "task", "input_id", "budget", "score_plain") for cell in cells)
    joined = a.join(b, on=["run_id", "task", "input_id", "budget"], suffix="_b")
    if q == "evicting_rows":
        return float(joined.height)
    return float((joined["score_plain"] == joined["score_plain_b"]).sum())


def _intervals(rows: pl.DataFrame, row: dict, cells: list, q: str, *, rng: np.random.Generator,
               n_boot: int) -> float:
    """Table 28 over the listed cells: how many cluster-bootstrap intervals of Δ exclude zero, or the
    smallest lower bound (one :func:`pagestats.metrics.delta_bootstrap` call, the cells in order)."""
    parts = [_need(_select(rows, row, cell), "score_gated") for cell in cells]
    boot = metrics.on_frame(metrics.delta_bootstrap, pl.concat(parts, how="vertical_relaxed"),
                            by=["model", "context_length", "evictor"], rng=rng, n_boot=n_boot)
    if q == "min_ci_low":
        return float(boot["low"].min())
    return float(((boot["low"] > 0) | (boot["high"] < 0)).sum())


def _interval(rows: pl.DataFrame, row: dict, *, rng: np.random.Generator, n_boot: int) -> dict:
    """The interval of a row: a Δ's cluster bootstrap (Table 28) or a pooled ρ's Wilson interval (Table 1)."""
    if row["quantity"] == "rho":
        rec = _recovery([_select(rows, row, cell) for cell in _cells(row)])
        return {"low": rec["low"], "high": rec["high"]}
    if row["quantity"] != "delta":
        raise ValueError(f"paper values: an interval is printed for {row['quantity']!r}; only Δ and ρ have one")
    (cell,) = _cells(row)
    boot = metrics.on_frame(metrics.delta_bootstrap, _select(rows, row, cell), by=["model"], rng=rng, n_boot=n_boot)
    return {"low": float(boot["low"][0]), "high": float(boot["high"][0])}
