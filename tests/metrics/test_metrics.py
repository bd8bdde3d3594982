"""pagestats.metrics / pagestats.metrics.scaling against brute-force Python loops over a hand-built frame."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import polars as pl
import pytest
from scipy.stats import norm
from polars.testing import assert_frame_equal

from pagestats import metrics, stats

R = metrics.relation  # the rows of a hand-built frame as a DuckDB relation, the engine every metric runs on

BUDGETS = (0.25, 0.5, 1.0)  # 1.0 is the audit row (plain == full)
CELLS = (("m1", 4096), ("m2", 4096), ("m1", 16384))
EVICTORS = ("snapkv", "h2o")
# task → (class, number of inputs); niah_multikey_3 never recovers (0/n), vt always does (n/n),
# fwe has a single input, qa_1 is random.
TASKS = {
    "niah_multikey_3": ("capacity-bound", 5),
    "vt": ("dilution-prone", 4),
    "qa_1": ("dilution-prone", 7),
    "fwe": ("dilution-prone", 1),
}


def build_rows(seed: int = 0) -> list[dict]:
    g = np.random.default_rng(seed)
    rows = []
    for model, ctx in CELLS:
        run = f"{model}-{ctx}"
        for task, (cls, n) in TASKS.items():
            for i in range(n):
                n_tok = int(g.integers(80, 121))
                drop = float(g.normal(0.02 if cls == "capacity-bound" else 0.1, 0.05))
                is_open = drop >= 0.07
                full = {"niah_multikey_3": 1.0, "vt": 0.0}.get(task, float(g.integers(0, 2)))
                for ev in EVICTORS:
                    for b in BUDGETS:
                        if b == 1.0:
                            plain = full
                        elif task == "niah_multikey_3":
                            plain = 0.0
                        elif task == "vt":
                            plain = 1.0 if b == 0.5 else 0.0
                        else:
                            plain = float(g.integers(0, 3)) / 2
                        kept = n_tok if b == 1.0 else int(round(b * n_tok))
                        rows.append(
                            dict(run_id=run, task=task, input_id=i, model=model, context_length=ctx, task_class=cls,
                                 evictor=ev, budget=b, n_tokens=n_tok, drop=drop, tau=0.07, gate_open=is_open,
                                 score_full=full, score_plain=plain, score_gated=plain if is_open else full,
                                 n_kept_plain=kept, n_kept_gated=kept if is_open else n_tok)
                        )
    return rows


ROWS = build_rows()
FRAME = pl.DataFrame(ROWS)
TASK_CELL = ("model", "context_length", "evictor", "task")


def unit(r):
    return (r["run_id"], r["task"], r["input_id"], r["evictor"])


def wilson_hand(k, n, level=0.95):
    z = norm.ppf(0.5 + level / 2)
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def as_dict(frame: pl.DataFrame, by, cols):
    return {tuple(r[c] for c in by): {c: r[c] for c in cols} for r in frame.iter_rows(named=True)}


# --------------------------------------------------------------------------- ρ, harm, r(x)


def test_recovery_rate_vs_loop():
    best, full = defaultdict(lambda: -1.0), {}
    for r in ROWS:
        if r["budget"] < 1:
            key = (tuple(r[c] for c in TASK_CELL), unit(r))
            best[key] = max(best[key], r["score_plain"])
            full[key] = r["score_full"]
    counts = defaultdict(lambda: [0, 0])
    for (g, u), b in best.items():
        counts[g][0] += b > full[(g, u)]
        counts[g][1] += 1
    got = as_dict(metrics.recovery_rate(R(FRAME)), TASK_CELL, ["k", "n", "rho", "low", "high", "dilution_prone"])
    assert set(got) == set(counts)
    for g, (k, n) in counts.items():
        row = got[g]
        assert (row["k"], row["n"]) == (k, n)
        assert row["rho"] == pytest.approx(k / n)
        assert (row["low"], row["high"]) == pytest.approx(wilson_hand(k, n))
        assert row["dilution_prone"] == (k / n >= 0.05)
    # degenerate groups are present: 0/n, n/n and one input
    assert all(got[g]["k"] == 0 for g in got if g[3] == "niah_multikey_3")
    assert all(got[g]["k"] == got[g]["n"] for g in got if g[3] == "vt")
    assert all(got[g]["n"] == 1 for g in got if g[3] == "fwe")
    assert all(got[g]["low"] == 0.0 for g in got if g[3] == "niah_multikey_3")


@pytest.mark.parametrize("arm", ["plain", "gated"])
def test_harm_rate_vs_loop(arm):
    by = ("model", "task")
    counts = defaultdict(lambda: [0, 0])
    for r in ROWS:
        counts[(r["model"], r["task"], r["budget"])][0] += r[f"score_{arm}"] < r["score_full"]
        counts[(r["model"], r["task"], r["budget"])][1] += 1
    got = as_dict(metrics.harm_rate(R(FRAME), by=by, arm=arm), (*by, "budget"), ["k", "n", "harm", "low", "high"])
    assert set(got) == set(counts)
    for g, (k, n) in counts.items():
        assert (got[g]["k"], got[g]["n"]) == (k, n)
        assert (got[g]["low"], got[g]["high"]) == pytest.approx(wilson_hand(k, n))


@pytest.mark.parametrize("include_full", [True, False])
def test_recovery_indicator_vs_loop(include_full):
    best, full = defaultdict(lambda: -1.0), {}
    for r in ROWS:
        if r["budget"] < 1:
            best[unit(r)] = max(best[unit(r)], r["score_gated"])
            full[unit(r)] = r["score_full"]
    got = metrics.recovery_indicator(R(FRAME), "gated", include_full=include_full)
    assert got.height == len(best)
    for r in got.iter_rows(named=True):
        u = (r["run_id"], r["task"], r["input_id"], r["evictor"])
        b = max(best[u], full[u]) if include_full else best[u]
        assert r["r"] == int(np.sign(b - full[u]))
    if include_full:
        assert got["r"].min() >= 0  # the identity of App. A.7.1
    else:
        assert got["r"].min() == -1  # closed-gate fallback never loses; open inputs can


# --------------------------------------------------------------------------- Δ and the bootstrap


@pytest.mark.parametrize("by", [("model", "context_length", "evictor"), TASK_CELL])
def test_delta_vs_loop(by):
    acc = defaultdict(list)
    units = defaultdict(set)
    for r in ROWS:
        if r["budget"] < 1:
            g = tuple(r[c] for c in by)
            acc[g].append(r["score_gated"] - r["score_plain"])
            units[g].add(unit(r))
    got = as_dict(metrics.delta(R(FRAME), by=by), by, ["delta", "n_inputs", "n_rows"])
    assert set(got) == set(acc)
    for g, d in acc.items():
        assert got[g]["delta"] == pytest.approx(sum(d) / len(d))
        assert (got[g]["n_inputs"], got[g]["n_rows"]) == (len(units[g]), len(d))


def test_deltas_by_several_groupings_in_one_scan_are_each_delta():
    """metrics.deltas(rows, groupings) is delta(rows, by=g) for each g, bit for bit, whatever the
    groupings' order, overlap or repeats."""
    groupings = [TASK_CELL, ("model", "context_length"), ("evictor",), TASK_CELL, ()]
    got = metrics.deltas(R(FRAME), groupings)
    assert len(got) == len(groupings)
    for by, frame in zip(groupings, got):
        assert_frame_equal(frame, metrics.delta(R(FRAME), by=by))
    assert frame.height == 1 and frame["n_rows"].item() == sum(r["budget"] < 1 for r in ROWS)


def test_by_groupings_is_one_group_by_per_grouping():
    """engine.by_groupings in one scan gives, per grouping, the rows of its own GROUP BY query."""
    from pagestats.metrics import engine

    rel = R(FRAME)
    groupings = [["model"], ["model", "evictor", "budget"], ["model"]]
    got = engine.by_groupings(rel, groupings, "count(*) AS n, max(score_plain) AS top", where="WHERE budget < 1")
    for by, frame in zip(groupings, got):
        want = engine.query(rel, f"SELECT {engine.names(by)}, count(*) AS n, max(score_plain) AS top "
                                 f"FROM {engine.ROWS} WHERE budget < 1 GROUP BY ALL")
        assert_frame_equal(frame.sort(by), want.sort(by), check_dtypes=False)


def test_delta_bootstrap_vs_stats_on_loop_built_cells():
    by = ("model", "context_length", "evictor")
    res = metrics.delta_bootstrap(R(FRAME), by=by, rng=np.random.default_rng(3), n_boot=400)
    # independent construction of the per-cell (inputs × budgets) matrices, cells in sorted order
    cells = defaultdict(lambda: defaultdict(dict))
    for r in ROWS:
        if r["budget"] < 1:
            cells[tuple(r[c] for c in by)][unit(r)][r["budget"]] = r["score_gated"] - r["score_plain"]
    keys = sorted(cells)
    mats = [np.array([[cells[k][u][b] for b in sorted(cells[k][u])] for u in sorted(cells[k])]) for k in keys]
    ref = stats.cluster_bootstrap(mats, rng=np.random.default_rng(3), n_boot=400)
    assert [tuple(r) for r in res.select(by).rows()] == keys
    np.testing.assert_allclose(res["delta"], ref.estimate)
    np.testing.assert_allclose(res["low"], ref.low)
    np.testing.assert_allclose(res["high"], ref.high)
    np.testing.assert_allclose(res["p_value"], ref.p_value)
    np.testing.assert_allclose(res["p_adjusted"], stats.bh(ref.p_value).adjusted)
    np.testing.assert_allclose(res["delta"], metrics.delta(R(FRAME), by=by)["delta"])
    assert res["n_budgets"].to_list() == [2] * len(keys)


def test_delta_bootstrap_unbalanced_raises():
    frame = FRAME.filter(~((pl.col("input_id") == 0) & (pl.col("task") == "qa_1") & (pl.col("budget") == 0.25)))
    with pytest.raises(ValueError, match="budget sets"):
        metrics.delta_bootstrap(R(frame), rng=np.random.default_rng(0), n_boot=10)


# --------------------------------------------------------------------------- gate and memory


def test_p_open_vs_loop():
    seen = {}
    for r in ROWS:
        seen[(r["model"], r["context_length"], r["run_id"], r["task"], r["input_id"])] = r["gate_open"]
    counts = defaultdict(lambda: [0, 0])
    for (m, c, *_), is_open in seen.items():
        counts[(m, c)][0] += is_open
        counts[(m, c)][1] += 1
    got = as_dict(metrics.p_open(R(FRAME)), ("model", "context_length"), ["k", "n", "p_open"])
    for g, (k, n) in counts.items():
        assert (got[g]["k"], got[g]["n"]) == (k, n) and got[g]["p_open"] == pytest.approx(k / n)
    bad = FRAME.with_columns(
        pl.when((pl.col("budget") == 0.25) & (pl.col("input_id") == 0)).then(~pl.col("gate_open"))
        .otherwise(pl.col("gate_open")).alias("gate_open")
    )
    with pytest.raises(ValueError, match="gate_open differs"):
        metrics.p_open(R(bad))


def test_task_means_vs_loop():
    """Mean and SD (ddof = 1) of D per (model, context, task) over each input once, against a loop
    with the statistics module; a null D counts in n, not in the mean; a disagreeing input is refused."""
    import statistics

    seen = {}
    for r in ROWS:
        seen[(r["model"], r["context_length"], r["task"], r["task_class"], r["run_id"], r["input_id"])] = r["drop"]
    values = defaultdict(list)
    for (m, c, t, tc, *_), d in seen.items():
        values[(m, c, t, tc)].append(d)
    got = as_dict(metrics.task_means(R(FRAME)), ("model", "context_length", "task", "task_class"), ["mean", "sd", "n"])
    assert set(got) == set(values)
    for g, v in values.items():
        assert got[g]["n"] == len(v)
        assert got[g]["mean"] == pytest.approx(statistics.fmean(v), rel=1e-15, abs=1e-17)
        if len(v) > 1:
            assert got[g]["sd"] == pytest.approx(statistics.stdev(v), rel=1e-14)
        else:  # fwe: one input, no SD
            assert got[g]["sd"] is None
    one_null = FRAME.with_columns(pl.when((pl.col("input_id") == 0) & (pl.col("task") == "qa_1")).then(None)
                                  .otherwise(pl.col("drop")).alias("drop"))
    out = metrics.task_means(R(one_null)).filter(pl.col("task") == "qa_1").sort("model", "context_length")
    for m, c, mean, n in out.select("model", "context_length", "mean", "n").iter_rows():
        v = values[(m, c, "qa_1", "dilution-prone")]
        kept = [d for (mm, cc, t, _, _, i), d in seen.items() if (mm, cc, t) == (m, c, "qa_1") and i != 0]
        assert n == len(v) and mean == pytest.approx(statistics.fmean(kept), rel=1e-15)
    bad = FRAME.with_columns(pl.when((pl.col("budget") == 0.25) & (pl.col("input_id") == 0)).then(pl.col("drop") + 1)
                             .otherwise(pl.col("drop")).alias("drop"))
    with pytest.raises(ValueError, match="drop differs"):
        metrics.task_means(R(bad))
    # sd=False (Tables 9–10 read only the means): the same means and n, bit for bit, without an sd column
    lean = metrics.task_means(R(FRAME), sd=False)
    assert lean.columns == ["model", "context_length", "task", "task_class", "mean", "n"]
    assert lean.equals(metrics.task_means(R(FRAME)).drop("sd"))
    with pytest.raises(ValueError, match="drop differs"):
        metrics.task_means(R(bad), sd=False)


def test_rows_known_one_per_input_are_read_as_they_are():
    """A relation recorded as one row per input (engine.known_unique of the input key: a block of
    decisions) gives the task means and p_open of the same rows gathered per input; a gated relation
    with several rows per input still gathers them (its numbers are the per-input ones)."""
    from pagestats.metrics import engine

    decisions = FRAME.select("run_id", "task", "input_id", "model", "context_length", "task_class", "drop",
                             "gate_open").unique(["run_id", "task", "input_id"], keep="first", maintain_order=True)
    assert decisions.height < FRAME.height
    marked = R(decisions)
    engine.known_unique(marked, engine.input_key(marked))
    assert "GROUP BY" not in engine.per_input(marked, ["model"], "drop")
    for metric, args in ((metrics.task_means, ("drop",)), (metrics.p_open, ())):
        assert_frame_equal(metric(marked, *args), metric(R(decisions), *args))
    assert_frame_equal(metrics.task_means(marked, "drop"), metrics.task_means(R(FRAME), "drop"))
    assert "GROUP BY" in engine.per_input(R(FRAME), ["model"], "drop")


def test_keys_checked_once_per_frame_within_and_per_relation_outside(monkeypatch):
    """Within engine.checked_once_per_frame a key of a frame is checked for repeats once, whatever
    relation of it a metric reads, another frame with the same rows is checked itself, and a frame's
    record goes with the frame; outside, each relation is checked. A frame with repeated keys is
    refused by every metric, within or not."""
    import gc

    from pagestats.metrics import engine

    scans = []  # checks of a key: a frame's relation's on the frame (repeats_a_key), others in SQL
    query, on_frame = engine.query, engine.repeats_a_key
    monkeypatch.setattr(engine, "query", lambda rows, sql: (scans.append(sql) if "HAVING count(*) > 1" in sql
                                                            else None) or query(rows, sql))
    monkeypatch.setattr(engine, "repeats_a_key", lambda frame, key: scans.append(key) or on_frame(frame, key))
    frame, twin = FRAME.clone(), FRAME.clone()
    doubled = pl.concat([FRAME, FRAME.head(1)])
    want = metrics.delta(R(FRAME), by=["model"])
    for _ in range(2):
        assert_frame_equal(metrics.on_frame(metrics.delta, frame, by=["model"]), want)
    assert len(scans) == 3
    with engine.checked_once_per_frame():
        for f in (frame, frame, twin, frame):
            assert_frame_equal(metrics.on_frame(metrics.delta, f, by=["model"]), want)
        assert len(scans) == 5
        for _ in range(2):
            with pytest.raises(ValueError, match="duplicate rows"):
                metrics.on_frame(metrics.delta, doubled, by=["model"])
        n = len(engine._FRAME_KEYS[-1])
        del twin
        gc.collect()
        assert len(engine._FRAME_KEYS[-1]) == n - 1
    assert not engine._FRAME_KEYS


@pytest.mark.parametrize("arm", ["plain", "gated"])
@pytest.mark.parametrize("by", [("model", "evictor"), ("model", "evictor", "budget")])
def test_kept_kv_vs_loop(arm, by):
    acc, acc_open = defaultdict(list), defaultdict(list)
    for r in ROWS:
        if r["budget"] < 1:
            g = tuple(r[c] for c in by)
            f = r[f"n_kept_{arm}"] / r["n_tokens"]
            acc[g].append(f)
            if r["gate_open"]:
                acc_open[g].append(f)
    got = as_dict(metrics.kept_kv(R(FRAME), by=by, arm=arm), by, ["kept_kv", "compression", "kept_kv_open", "n_rows"])
    for g, v in acc.items():
        assert got[g]["kept_kv"] == pytest.approx(np.mean(v))
        assert got[g]["compression"] == pytest.approx(1 / np.mean(v))
        assert got[g]["kept_kv_open"] == pytest.approx(np.mean(acc_open[g]))
        assert got[g]["n_rows"] == len(v)
    comp = metrics.compression(R(FRAME), by=by, arm=arm)
    np.testing.assert_allclose(comp["compression"], 1 / comp["kept_kv"])


def test_static_batching_closed_form_and_simulation():
    out = metrics.static_batching(0.75, 0.0625, [1, 2, 4, 8, 16])
    comp = dict(zip(out["batch_size"], out["compression"]))
    assert comp[1] == pytest.approx(1 / (0.25 + 0.75 * 0.0625))  # ≈ 3.37×, Table 22's realized compression
    assert comp[16] <= 1.05
    assert list(out["compression"]) == sorted(out["compression"], reverse=True)
    for b, c in comp.items():
        assert c == pytest.approx(1 / ((1 - 0.75**b) + 0.75**b * 0.0625))
    # simulation of "a batch is provisioned for its largest resident cache"
    g = np.random.default_rng(0)
    for b in (1, 4):
        resident = np.where(g.uniform(size=(200_000, b)) < 0.75, 0.0625, 1.0)
        assert 1 / resident.max(axis=1).mean() == pytest.approx(comp[b], rel=0.02)
    two = metrics.static_batching([0.5, 1.0], [0.1, 0.2], [1, 3])
    assert two.height == 4 and two.filter(pl.col("p_open") == 1.0)["compression"].to_list() == pytest.approx([5, 5])
    with pytest.raises(ValueError):
        metrics.static_batching(1.5, 0.1, [1])
    with pytest.raises(ValueError):
        metrics.static_batching(0.5, 0.1, [0])


def test_delta_of_f_linear():
    assert metrics.delta_of_f(0.78, 0.045, 0.0) == pytest.approx(0.045)
    assert metrics.delta_of_f(0.78, 0.045, 1.0) == pytest.approx(0.78)
    assert metrics.delta_of_f(0.78, 0.045, 0.5) == pytest.approx((0.78 + 0.045) / 2)
    f = np.linspace(0, 1, 11)
    v = metrics.delta_of_f(np.array([[0.78], [0.5]]), np.array([[0.045], [0.0]]), f)
    assert v.shape == (2, 11)
    np.testing.assert_allclose(np.diff(v, 2, axis=1), 0, atol=1e-12)  # linear in f
    with pytest.raises(ValueError):
        metrics.delta_of_f(1, 0, 1.2)


def test_oracle_gap_vs_loop():
    oracle_rows = []
    for r in ROWS:
        o = r["task_class"] != "capacity-bound"
        oracle_rows.append({**r, "gate_open": o, "score_gated": r["score_plain"] if o else r["score_full"],
                            "n_kept_gated": r["n_kept_plain"] if o else r["n_tokens"]})
    acc = defaultdict(lambda: [[], []])
    for r, o in zip(ROWS, oracle_rows):
        if r["budget"] < 1:
            g = (r["model"], r["context_length"], r["evictor"])
            acc[g][0].append(r["score_gated"] - r["score_plain"])
            acc[g][1].append(o["score_gated"] - o["score_plain"])
    got = as_dict(metrics.oracle_gap(R(FRAME), R(pl.DataFrame(oracle_rows))), ("model", "context_length", "evictor"),
                  ["gap"])
    for g, (p, o) in acc.items():
        assert got[g]["gap"] == pytest.approx(np.mean(p) - np.mean(o))
    with pytest.raises(ValueError, match="same cells"):
        metrics.oracle_gap(R(FRAME), R(pl.DataFrame(oracle_rows).filter(pl.col("model") == "m1")))


# --------------------------------------------------------------------------- AUC


def test_auc_by_signal_vs_pair_count():
    inputs = {}
    for r in ROWS:
        inputs[(r["model"], r["context_length"], r["run_id"], r["task"], r["input_id"])] = (r["drop"], r["task_class"])
    groups = defaultdict(lambda: ([], []))
    for (m, c, *_), (d, cls) in inputs.items():
        groups[(m, c)][cls == "capacity-bound"].append(d)
    got = as_dict(metrics.auc_by_signal(R(FRAME)), ("model", "context_length"), ["auc", "n_capacity", "n_dilution"])
    for g, (dil, cap) in groups.items():
        pairs = [1.0 if x > y else 0.5 if x == y else 0.0 for x in dil for y in cap]
        assert got[g]["auc"] == pytest.approx(np.mean(pairs))
        assert (got[g]["n_capacity"], got[g]["n_dilution"]) == (len(cap), len(dil))
    only = metrics.auc_by_signal(R(FRAME), capacity_tasks=["niah_multikey_3"], dilution_tasks=["vt"])
    assert only["n_dilution"].to_list() == [4, 4, 4]
    none = metrics.auc_by_signal(R(FRAME.filter(pl.col("task") == "vt")))
    assert none["auc"].null_count() == none.height and none["n_capacity"].to_list() == [0, 0, 0]


# --------------------------------------------------------------------------- scaling


def test_scaling_rows_fit_and_band_vs_loop():
    snap = FRAME.filter(pl.col("evictor") == "snapkv")
    rows = metrics.scaling_rows(R(snap))
    by = ("model", "context_length", "task")
    full = defaultdict(dict)
    for r in ROWS:
        if r["evictor"] == "snapkv":
            full[tuple(r[c] for c in by)][r["input_id"]] = r["score_full"]
    got = as_dict(rows, by, ["a_full", "headroom", "n", "rho", "ratio"])
    rho = as_dict(metrics.recovery_rate(R(snap), by=by), by, ["rho"])
    for g, per in full.items():
        a = np.mean(list(per.values()))
        assert got[g]["a_full"] == pytest.approx(a) and got[g]["headroom"] == pytest.approx(1 - a)
        assert got[g]["n"] == len(per) and got[g]["rho"] == rho[g]["rho"]
        assert got[g]["ratio"] == (None if a == 1 else pytest.approx(rho[g]["rho"] / (1 - a)))
    fit = metrics.scaling_fit(rows)
    sub = rows.filter((pl.col("task_class") == "dilution-prone") & (pl.col("headroom") > 0))
    h, k, n = sub["headroom"].to_numpy(), sub["k"].to_numpy(), sub["n"].to_numpy()
    b = k.sum() / (n * h).sum()  # binomial score equation of the slope through the origin, by Newton
    for _ in range(100):
        mu = b * h
        b += np.sum(h * (k - n * mu) / (mu * (1 - mu))) / np.sum(n * h * h / (mu * (1 - mu)))
    assert fit.slope == pytest.approx(b, rel=1e-6) and fit.n == sub.height
    # pre-registration band: min/max ratio per task over fitting rows with headroom > 0
    fit_rows = rows.filter(pl.col("context_length") == 4096)
    band = metrics.predict_band(fit_rows, pl.DataFrame({"task": ["qa_1", "vt"], "headroom": [0.5, 0.8]}))
    for r in band.iter_rows(named=True):
        ratios = [x["rho"] / x["headroom"] for x in fit_rows.iter_rows(named=True)
                  if x["task"] == r["task"] and x["headroom"] > 0]
        assert r["predicted_low"] == pytest.approx(min(ratios) * r["headroom"])
        assert r["predicted_high"] == pytest.approx(max(ratios) * r["headroom"])
        assert r["n_fit_rows"] == len(ratios)
    with pytest.raises(ValueError, match="no fitting rows"):
        metrics.predict_band(fit_rows, pl.DataFrame({"task": ["niah_multikey_3"], "headroom": [0.5]}))
    with pytest.raises(ValueError, match="several evictors"):
        metrics.scaling_rows(R(FRAME))


# --------------------------------------------------------------------------- input checking and empties


def test_empty_selection_gives_empty_frames():
    empty = FRAME.filter(pl.col("task") == "no_such_task")
    for fn in (metrics.recovery_rate, metrics.harm_rate, metrics.delta, metrics.kept_kv, metrics.p_open):
        out = fn(R(empty))
        assert out.height == 0 and len(out.columns) > 0
    assert metrics.delta_bootstrap(R(empty), rng=np.random.default_rng(0)).height == 0
    assert metrics.auc_by_signal(R(empty)).height == 0
    assert metrics.recovery_indicator(R(empty)).height == 0


def test_input_errors():
    with pytest.raises(ValueError, match="missing columns"):
        metrics.recovery_rate(R(FRAME.drop("score_full")))
    with pytest.raises(ValueError, match="arm"):
        metrics.recovery_rate(R(FRAME), arm="full")
    with pytest.raises(ValueError, match="duplicate"):
        metrics.delta(R(pl.concat([FRAME, FRAME.head(1)])))
    draws = pl.concat([FRAME.with_columns(pl.lit(d).alias("pair_draw")) for d in (0, 1)])
    with pytest.raises(ValueError, match="pair_draw"):
        metrics.p_open(R(draws))
    per_draw = metrics.p_open(R(draws), by=("model", "pair_draw"))
    assert per_draw.height == 4
    with pytest.raises(TypeError):
        metrics.delta(ROWS)
    with pytest.raises(TypeError):
        metrics.delta(FRAME)


def test_delta_bootstrap_shared_inputs():
    by = ("model", "context_length", "evictor")
    one_cell = FRAME.filter((pl.col("model") == "m1") & (pl.col("context_length") == 4096))
    shared = metrics.delta_bootstrap(R(one_cell), by=by, rng=np.random.default_rng(4), n_boot=300, shared_inputs=True)
    # the two evictor cells hold the same inputs: rebuild them by loop and share one index stream
    mats = []
    for ev in sorted(EVICTORS):
        per = defaultdict(dict)
        for r in ROWS:
            if r["model"] == "m1" and r["context_length"] == 4096 and r["evictor"] == ev and r["budget"] < 1:
                per[(r["run_id"], r["task"], r["input_id"])][r["budget"]] = r["score_gated"] - r["score_plain"]
        mats.append(np.array([[per[u][b] for b in sorted(per[u])] for u in sorted(per)]))
    ref = stats.cluster_bootstrap(mats, rng=np.random.default_rng(4), n_boot=300, shared_inputs=True)
    np.testing.assert_allclose(shared["low"], ref.low)
    np.testing.assert_allclose(shared["high"], ref.high)
    with pytest.raises(ValueError, match="same inputs"):
        metrics.delta_bootstrap(R(FRAME.filter(pl.col("context_length") == 4096)), by=by,
                                rng=np.random.default_rng(0), n_boot=10, shared_inputs=True)


def test_delta_bootstrap_refuses_units_with_different_budget_sets():
    """Two inputs of one cell, each at two budgets but not the same two: no balanced grid."""
    rows = [("r", "t", i, b) for i, budgets in ((0, (0.25, 0.5)), (1, (0.125, 0.5))) for b in budgets]
    frame = pl.DataFrame(rows, schema=["run_id", "task", "input_id", "budget"], orient="row").with_columns(
        pl.lit("m").alias("model"), pl.lit(4096).alias("context_length"), pl.lit("snapkv").alias("evictor"),
        pl.lit(0.0).alias("score_plain"), pl.lit(1.0).alias("score_gated"))
    with pytest.raises(ValueError, match="different budget sets"):
        metrics.delta_bootstrap(R(frame), rng=np.random.default_rng(0), n_boot=10)
    balanced = frame.filter(pl.col("budget") == 0.5)
    assert metrics.delta_bootstrap(R(balanced), rng=np.random.default_rng(0), n_boot=10)["delta"].item() == 1.0


# --------------------------------------------------------------------------- accuracy, and one SQL for the report and whatif


@pytest.mark.parametrize("by", [("model", "evictor", "budget"), ("model", "context_length", "evictor")])
def test_accuracy_vs_loop(by):
    arms = defaultdict(lambda: defaultdict(list))
    inputs = defaultdict(set)
    for r in ROWS:  # every budget, the b = 1 audit rows included
        g = tuple(r[c] for c in by)
        for arm in ("full", "plain", "gated"):
            arms[g][arm].append(r[f"score_{arm}"])
        inputs[g].add((r["run_id"], r["task"], r["input_id"]))
    got = as_dict(metrics.accuracy(R(FRAME), by=by), by, ["acc_full", "acc_plain", "acc_gated", "delta", "n_inputs"])
    assert set(got) == set(arms)
    for g, per in arms.items():
        for arm, values in per.items():
            assert got[g][f"acc_{arm}"] == pytest.approx(sum(values) / len(values), abs=1e-15)
        assert got[g]["delta"] == pytest.approx(np.mean(per["gated"]) - np.mean(per["plain"]), abs=1e-15)
        assert got[g]["n_inputs"] == len(inputs[g])


def test_full_accuracy_counts_each_input_once():
    full = defaultdict(dict)
    for r in ROWS:
        full[(r["model"], r["task"])][(r["run_id"], r["input_id"])] = r["score_full"]
    got = as_dict(metrics.full_accuracy(R(FRAME), by=("model", "task")), ("model", "task"), ["acc_full", "n"])
    for g, per in full.items():
        assert got[g]["n"] == len(per)
        assert got[g]["acc_full"] == pytest.approx(np.mean(list(per.values())), abs=1e-15)
    unknown = FRAME.with_columns(pl.when(pl.col("input_id") == 0).then(None).otherwise(pl.col("score_full"))
                                 .alias("score_full"))
    assert metrics.full_accuracy(R(unknown), by=("model",))["acc_full"].is_null().all()


def test_a_mean_does_not_depend_on_the_row_order():
    """Exact means (formulas.mean): the same rows in another order give the same bits."""
    shuffled = FRAME.sample(fraction=1.0, shuffle=True, seed=3)
    for fn in (metrics.delta, metrics.accuracy, metrics.kept_kv):
        assert fn(R(FRAME)).equals(fn(R(shuffled)))


def test_the_replay_relation_and_the_whatif_read_one_sql():
    """A metric over the replay's own ``gated`` relation equals the metric over the gated-outcome frame,
    and accuracy, harm and kept-KV per what-if cell are the what-if table's numbers, bit for bit."""
    from pagestats import replay, testing
    from pagestats.replay.whatif import replay_whatif

    logs = testing.synthetic_logs(models={"m6": (6, 3)}, evictors=("snapkv", "h2o"), tasks=("niah_multikey_3", "vt"),
                                  n_inputs=7, budgets=(0.125, 0.5, 1.0), with_topk=False, with_text=False,
                                  context_lengths=(4096,), seed=2)
    cell = ["model", "context_length", "evictor", "task", "budget"]
    with replay.Replay(logs) as session:
        session.gated_relation()
        rel = session.con.table("gated")
        acc = metrics.accuracy(rel, by=cell)
        kept = metrics.kept_kv(rel, by=cell, include_full=True)
        harm = metrics.harm_rate(rel, by=cell[:-1], arm="gated")
        table = replay_whatif(session)
    frame = replay.gated_outcomes(logs)
    assert metrics.accuracy(R(frame), by=cell).equals(acc)
    joined = table.join(acc, on=cell, suffix="_m").join(kept, on=cell).join(harm, on=cell)
    assert joined.height == table.height > 0
    for col in ("acc_full", "acc_plain", "acc_gated", "delta"):
        assert (joined[col] == joined[f"{col}_m"]).all(), col
    assert (joined["kept_kv"] == joined["kept_kv_right"]).all()
    assert (joined["harm_gated"] == joined["harm"]).all()


def test_on_frame_types_the_names_as_the_frame_holds_them():
    """Text comes back from SQL as String; on_frame casts it to the frame's categorical, so that the
    result joins the frame's own aggregates (polars joins no String key with a Categorical one)."""
    cat = FRAME.with_columns(pl.col("model", "task").cast(pl.Categorical))
    plain = metrics.delta(R(cat), by=("model", "task"))
    assert plain.schema["model"] == pl.String
    typed = metrics.on_frame(metrics.delta, cat, by=("model", "task"))
    assert typed.schema["model"] == pl.Categorical and typed.schema["task"] == pl.Categorical
    assert typed.cast({"model": pl.String, "task": pl.String}).equals(plain)
    counts = cat.group_by("model", "task").agg(pl.len())
    assert typed.join(counts, on=["model", "task"]).height == typed.height
