"""Figures: each ``*_data`` function against an independent brute-force computation on a
small hand-built frame, and each figure renders (Agg, PNG) with labelled axes."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import polars as pl
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pagestats import figures as F

TASKS = {"niah_multikey_3": "capacity-bound", "vt": "dilution-prone", "fwe": "dilution-prone"}
BUDGETS = (0.125, 0.5, 1.0)


def hand_gated(seed: int = 0, models=("m1", "m2"), contexts=(4096,), evictors=("snapkv", "h2o"), n=5):
    """A small gated-outcomes frame with the documented columns, built row by row."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, ctx in itertools.product(models, contexts):
        run = f"{model}-{ctx}"
        for task, cls in TASKS.items():
            for i in range(n):
                n_tokens = int(rng.integers(900, 1000))
                drop = float(rng.normal(0.0 if cls == "capacity-bound" else 0.12, 0.05))
                tau = 0.07
                gate_open = drop >= tau
                full = float(rng.integers(0, 2))
                for ev in evictors:
                    for b in BUDGETS:
                        plain = full if b == 1.0 else float(rng.integers(0, 3)) / 2
                        kept = n_tokens if b == 1.0 else max(int(b * n_tokens), 36)
                        rows.append(dict(
                            run_id=run, task=task, input_id=i, model=model, context_length=ctx,
                            task_class=cls, evictor=ev, budget=b, n_tokens=n_tokens, drop=drop, tau=tau,
                            gate_open=gate_open, score_full=full, score_plain=plain,
                            score_gated=plain if gate_open else full,
                            n_kept_plain=kept, n_kept_gated=kept if gate_open else n_tokens,
                        ))
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def gated():
    return hand_gated()


def _rows(frame):
    return frame.to_dicts()


def _assert_axes_labelled(ax: Axes):
    assert ax.get_xlabel() or ax.get_xticklabels(), "x axis unlabelled"
    assert ax.get_ylabel(), "y axis unlabelled"


def _render(fig: Figure, tmp_path, name: str, formats=("png",)):
    paths = F.save_figure(fig, tmp_path / name, formats=formats)
    for p in paths:
        with open(p, "rb") as fh:
            head = fh.read(8)
        assert head.startswith(b"\x89PNG") or head.startswith(b"%PDF")
    return paths


# --------------------------------------------------------------------------- Fig. 2
def test_drop_by_task_data_means_and_order(gated):
    gate = gated.unique(subset=["run_id", "task", "input_id"]).sort("run_id", "task", "input_id")
    data = F.drop_by_task_data(gate)
    assert data.height == gate.height
    sums, counts, pooled = defaultdict(float), defaultdict(int), defaultdict(list)
    for r in _rows(gate):
        key = (r["model"], r["context_length"], r["task"])
        sums[key] += r["drop"]
        counts[key] += 1
        pooled[r["task"]].append(r["drop"])
    for r in _rows(data):
        key = (r["model"], r["context_length"], r["task"])
        assert r["task_mean"] == pytest.approx(sums[key] / counts[key])
    # capacity-bound first, then dilution-prone by ascending pooled mean
    dil = sorted((t for t in TASKS if TASKS[t] == "dilution-prone"), key=lambda t: np.mean(pooled[t]))
    expected = ["niah_multikey_3", *dil]
    ranks = dict(data.select("task", "task_rank").unique().iter_rows())
    assert sorted(ranks, key=ranks.get) == expected
    # slots are 0..n-1 within each (cell, task)
    for (_, sub) in data.group_by("model", "context_length", "task"):
        assert sorted(sub["slot"].to_list()) == list(range(sub.height))


def test_drop_by_task_missing_column():
    with pytest.raises(ValueError, match="drop"):
        F.drop_by_task_data(pl.DataFrame({"task": ["vt"]}))


def test_drop_by_task_renders(gated, tmp_path):
    gate = gated.unique(subset=["run_id", "task", "input_id"])
    fig = F.drop_by_task(gate)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    _assert_axes_labelled(fig.axes[0])
    assert [p.rsplit(".", 1)[1] for p in _render(fig, tmp_path, "fig2", ("png", "pdf"))] == ["png", "pdf"]


# --------------------------------------------------------------------------- Fig. 3
def test_accuracy_by_budget_data_brute_force(gated):
    data = F.accuracy_by_budget_data(gated)
    acc = defaultdict(list)
    for r in _rows(gated):
        key = (r["model"], r["context_length"], r["evictor"], r["task"], r["budget"])
        acc[key + ("full",)].append(r["score_full"])
        acc[key + ("plain",)].append(r["score_plain"])
        acc[key + ("gated",)].append(r["score_gated"])
    assert data.height == len(acc)
    for r in _rows(data):
        key = (r["model"], r["context_length"], r["evictor"], r["task"], r["budget"], r["arm"])
        assert r["accuracy"] == pytest.approx(sum(acc[key]) / len(acc[key]))
        assert r["n_inputs"] == len(acc[key])


def test_accuracy_vs_budget_needs_one_cell(gated):
    with pytest.raises(ValueError, match="one cell"):
        F.accuracy_vs_budget(gated)


def test_accuracy_vs_budget_renders(gated, tmp_path):
    fig = F.accuracy_vs_budget(gated, model="m1", evictor="snapkv")
    assert isinstance(fig, Figure) and len(fig.axes) == len(TASKS)
    _assert_axes_labelled(fig.axes[0])
    assert fig.axes[-1].get_xlabel() == "KV budget b"
    _render(fig, tmp_path, "fig3")


# --------------------------------------------------------------------------- Fig. 4
def test_pareto_mask_brute_force():
    rng = np.random.default_rng(3)
    cost, value = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 40).astype(float)
    expected = []
    for i in range(40):
        dominated = any(
            cost[j] <= cost[i] and value[j] >= value[i] and (cost[j] < cost[i] or value[j] > value[i])
            for j in range(40)
        )
        expected.append(not dominated)
    assert F.pareto_mask(cost, value).tolist() == expected


def test_frontier_data_brute_force(gated):
    data = F.frontier_data(gated)
    kept, acc = defaultdict(list), defaultdict(list)
    full = defaultdict(dict)
    for r in _rows(gated):
        cell = (r["model"], r["context_length"], r["evictor"])
        full[cell][(r["run_id"], r["task"], r["input_id"])] = r["score_full"]
        if r["budget"] >= 1:
            continue
        for arm in ("plain", "gated"):
            kept[cell + (r["budget"], arm)].append(r[f"n_kept_{arm}"] / r["n_tokens"])
            acc[cell + (r["budget"], arm)].append(r[f"score_{arm}"])
    assert data.height == len(kept) + len(full)
    for r in _rows(data):
        cell = (r["model"], r["context_length"], r["evictor"])
        if r["arm"] == "full":
            assert r["kept_kv"] == 1.0
            assert r["accuracy"] == pytest.approx(np.mean(list(full[cell].values())))
            continue
        key = cell + (r["budget"], r["arm"])
        assert r["kept_kv"] == pytest.approx(np.mean(kept[key]))
        assert r["accuracy"] == pytest.approx(np.mean(acc[key]))
    # gated never keeps less than plain at the same budget (closed gate keeps everything)
    wide = data.filter(pl.col("arm") != "full").pivot(on="arm", index=["model", "context_length", "evictor", "budget"],
                                                      values="kept_kv")
    assert (wide["gated"] >= wide["plain"] - 1e-12).all()
    # frontier flags agree with the brute-force Pareto rule per cell
    for (_, sub) in data.group_by("model", "context_length", "evictor"):
        pts = list(zip(sub["kept_kv"], sub["accuracy"], sub["on_frontier"]))
        for c, a, flag in pts:
            dominated = any(c2 <= c and a2 >= a and (c2 < c or a2 > a) for c2, a2, _ in pts)
            assert flag == (not dominated)


def test_accuracy_vs_kept_kv_renders(gated, tmp_path):
    fig = F.accuracy_vs_kept_kv(gated, evictor="snapkv")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert "kept-KV" in ax.get_xlabel() and ax.get_ylabel() == "accuracy"
    _render(ax.figure, tmp_path, "fig4")


# --------------------------------------------------------------------------- Fig. 5
def _hand_inputs():
    rng = np.random.default_rng(1)
    rows = []
    for model, n_layers in (("m1", 6), ("m2", 9)):
        for task, cls in TASKS.items():
            for i in range(4):
                rows.append(dict(model=model, context_length=4096, task=task, task_class=cls, input_id=i,
                                 agreement=rng.uniform(0.1, 0.5, n_layers).astype(np.float32).tolist()))
    return pl.DataFrame(rows, schema_overrides={"agreement": pl.List(pl.Float32)})


def test_agreement_profile_data_brute_force():
    from pagestats.profile import bin_layers

    inputs = _hand_inputs()
    data = F.agreement_profile_data(inputs)
    sums = defaultdict(list)
    for r in _rows(inputs):
        for layer, a in enumerate(r["agreement"]):
            sums[(r["model"], r["task"], layer)].append(a)
    assert data.height == len(sums)
    for r in _rows(data):
        vals = sums[(r["model"], r["task"], r["layer"])]
        assert r["agreement"] == pytest.approx(float(np.mean(np.asarray(vals, dtype=np.float64))))
        assert r["n_inputs"] == len(vals)
        early, late = bin_layers(r["n_layers"])
        expected = "early" if r["layer"] in early else "late" if r["layer"] in late else "middle"
        assert r["bin"] == expected
    assert set(data.filter(pl.col("model") == "m2")["n_layers"].to_list()) == {9}


def test_agreement_profile_renders(tmp_path):
    fig = F.agreement_profile(_hand_inputs())
    assert isinstance(fig, Figure)
    _assert_axes_labelled(fig.axes[0])
    _render(fig, tmp_path, "fig5")


# --------------------------------------------------------------------------- Fig. 6
def _curve():
    tau = np.round(np.arange(0.0, 0.21, 0.01), 4)
    delta = np.where((tau >= 0.05) & (tau <= 0.10), 0.20, 0.10)
    delta = np.where(tau == 0.08, 0.205, delta)
    fp = np.clip(0.3 - 4 * tau, 0, 1)
    fn = np.clip(5 * (tau - 0.10), 0, 1)
    frame = pl.DataFrame({"tau": tau, "delta": delta, "fp_rate": fp, "fn_rate": fn})
    return pl.concat([frame.with_columns(pl.lit(m).alias("model")) for m in ("m1", "m2")]).sample(
        fraction=1.0, shuffle=True, seed=0)


def test_tau_sensitivity_data_plateau_brute_force():
    curve = _curve()
    data = F.tau_sensitivity_data(curve, tau0=0.07)
    for model in ("m1", "m2"):
        sub = data.filter(pl.col("model") == model)
        assert sub["tau"].to_list() == sorted(sub["tau"].to_list())
        rows = _rows(sub)
        d0 = [r["delta"] for r in rows if abs(r["tau"] - 0.07) < 1e-9][0]
        ok = [abs(r["delta"] - d0) <= 0.01 + 1e-12 and r["fp_rate"] + r["fn_rate"] <= 0.10 + 1e-12 for r in rows]
        assert sub["in_plateau"].to_list() == ok
        # brute-force band: walk outwards from τ0 while ok
        i0 = [i for i, r in enumerate(rows) if abs(r["tau"] - 0.07) < 1e-9][0]
        band = [False] * len(rows)
        if ok[i0]:
            j = i0
            while j >= 0 and ok[j]:
                band[j] = True
                j -= 1
            j = i0 + 1
            while j < len(rows) and ok[j]:
                band[j] = True
                j += 1
        assert sub["in_band"].to_list() == band
        taus = [r["tau"] for r, b in zip(rows, band) if b]
        # FP + FN ≤ 0.10 needs τ ≥ 0.05; Δ stays within 1 pp of Δ_τ0 up to τ = 0.10
        assert min(taus) == pytest.approx(0.05) and max(taus) == pytest.approx(0.10)


def test_tau_sensitivity_band_empty_when_tau0_fails():
    curve = _curve().filter(pl.col("model") == "m1")
    data = F.tau_sensitivity_data(curve, tau0=0.0)  # FP = 0.3 at τ = 0
    assert not data["in_band"].any()


def test_tau_sensitivity_renders(tmp_path):
    fig = F.tau_sensitivity(_curve())
    assert isinstance(fig, Figure)
    _assert_axes_labelled(fig.axes[0])
    assert fig.axes[0].get_xlabel() == "threshold τ"
    _render(fig, tmp_path, "fig6")


# --------------------------------------------------------------------------- Fig. 7 / 8
def _brute_delta(gated, cls=None):
    diffs = defaultdict(list)
    for r in _rows(gated):
        if r["budget"] >= 1 or (cls is not None and r["task_class"] != cls):
            continue
        diffs[(r["model"], r["context_length"], r["evictor"])].append(r["score_gated"] - r["score_plain"])
    return {k: sum(v) / len(v) for k, v in diffs.items()}


def test_delta_matrix_data_brute_force(gated):
    data = F.delta_matrix_data(gated)
    expected = _brute_delta(gated)
    assert data.height == len(expected)
    for r in _rows(data):
        assert r["delta"] == pytest.approx(expected[(r["model"], r["context_length"], r["evictor"])])


def test_delta_of_f_data_brute_force(gated):
    f = [0.0, 0.25, 1.0]
    data = F.delta_of_f_data(gated, f=f)
    cap, rest = _brute_delta(gated, "capacity-bound"), _brute_delta(gated, "dilution-prone")
    cells = data.filter(pl.col("line") == "cell")
    for r in _rows(cells):
        key = (r["model"], r["context_length"], r["evictor"])
        assert r["delta"] == pytest.approx(r["f"] * cap[key] + (1 - r["f"]) * rest[key])
    for r in _rows(data.filter(pl.col("line") == "mean")):
        vals = [r["f"] * cap[k] + (1 - r["f"]) * rest[k] for k in cap]
        assert r["delta"] == pytest.approx(sum(vals) / len(vals))
    assert data["suite_share"][0] == pytest.approx(1 / 3)


def test_delta_of_f_needs_both_classes(gated):
    with pytest.raises(ValueError, match="both task classes"):
        F.delta_of_f_data(gated.filter(pl.col("task_class") == "dilution-prone"))


def test_delta_matrix_and_delta_of_f_render(gated, tmp_path):
    fig = F.delta_matrix(gated)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "base evictor" and len(ax.get_yticklabels()) == 2
    _render(ax.figure, tmp_path, "fig8")
    ax = F.delta_of_f(gated).axes[0]
    _assert_axes_labelled(ax)
    _render(ax.figure, tmp_path, "fig7")


# --------------------------------------------------------------------------- Fig. 9
def test_scaling_data_brute_force():
    g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    data = F.scaling_data(g)
    per = defaultdict(dict)
    for r in _rows(g):
        key = (r["model"], r["context_length"], r["task"])
        u = per[key].setdefault((r["run_id"], r["input_id"]), {"full": r["score_full"], "best": -1.0})
        if r["budget"] < 1:
            u["best"] = max(u["best"], r["score_plain"])
    xs, ys = [], []
    for r in _rows(data):
        units = per[(r["model"], r["context_length"], r["task"])].values()
        a_full = np.mean([u["full"] for u in units])
        rho = np.mean([u["best"] > u["full"] for u in units])
        assert r["headroom"] == pytest.approx(1 - a_full)
        assert r["rho"] == pytest.approx(rho)
        if r["task_class"] == "dilution-prone" and a_full < 1:
            xs.append(1 - a_full)
            ys.append((rho * len(units), len(units)))
    # binomial maximum likelihood through the origin, by a grid-free Newton search on the score
    x = np.asarray(xs)
    k = np.asarray([a for a, _ in ys])
    n = np.asarray([b for _, b in ys])
    slope = k.sum() / (n * x).sum()
    for _ in range(100):
        mu = slope * x
        score = np.sum(x * (k - n * mu) / (mu * (1 - mu)))
        info = np.sum(n * x * x / (mu * (1 - mu)))
        slope += score / info
    assert data["fit_slope"][0] == pytest.approx(slope, rel=1e-6)
    assert data["fit_se"][0] == pytest.approx(1 / np.sqrt(info), rel=1e-4)


def test_scaling_data_needs_one_evictor(gated):
    with pytest.raises(ValueError, match="evictor"):
        F.scaling_data(gated)


def test_rho_vs_headroom_renders(tmp_path):
    g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    ax = F.rho_vs_headroom(g).axes[0]
    _assert_axes_labelled(ax)
    assert "headroom" in ax.get_xlabel()
    _render(ax.figure, tmp_path, "fig9")


# --------------------------------------------------------------------------- Figs. 10-11
def _brute_r(gated):
    best, full = {}, {}
    for r in _rows(gated):
        unit = (r["run_id"], r["model"], r["context_length"], r["task"], r["input_id"], r["evictor"])
        full[unit] = r["score_full"]
        if r["budget"] < 1:
            best[unit] = max(best.get(unit, -1.0), r["score_gated"])
    return {u: int(math.copysign(1, max(best[u], full[u]) - full[u])) if max(best[u], full[u]) != full[u] else 0
            for u in full}


def test_recovery_distribution_data_brute_force(gated):
    r = _brute_r(gated)
    data = F.recovery_distribution_data(gated)
    counts = defaultdict(int)
    n = defaultdict(int)
    for unit, value in r.items():
        counts[(unit[3], value)] += 1
        n[unit[3]] += 1
    assert data.height == 3 * len(TASKS)
    for row in _rows(data):
        assert row["count"] == counts[(row["task"], row["r"])]
        assert row["fraction"] == pytest.approx(counts[(row["task"], row["r"])] / n[row["task"]])
    assert data.filter(pl.col("r") == -1)["count"].sum() == 0  # empty by construction (App. A.7.1)


def test_recovery_fraction_data_brute_force(gated):
    from statsmodels.stats.proportion import proportion_confint

    r = _brute_r(gated)
    data = F.recovery_fraction_data(gated)
    k, n = defaultdict(int), defaultdict(int)
    for unit, value in r.items():
        key = (unit[1], unit[2], unit[3])
        k[key] += value > 0
        n[key] += 1
    assert data.height == len(n)
    for row in _rows(data):
        key = (row["model"], row["context_length"], row["task"])
        assert (row["k"], row["n"]) == (k[key], n[key])
        lo, hi = proportion_confint(k[key], n[key], method="wilson")
        assert row["low"] == pytest.approx(lo) and row["high"] == pytest.approx(hi)


def test_recovery_figures_render(gated, tmp_path):
    fig = F.recovery_distribution(gated)
    assert isinstance(fig, Figure) and len(fig.axes) == len(TASKS)
    _assert_axes_labelled(fig.axes[0])
    _render(fig, tmp_path, "fig10")
    fig = F.recovery_fraction(gated)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    _assert_axes_labelled(fig.axes[0])
    _render(fig, tmp_path, "fig11")


# --------------------------------------------------------------------------- ax= and pyplot
def test_ax_is_used_and_pyplot_untouched(gated):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = Figure()
    ax = fig.add_subplot()
    assert F.delta_matrix(gated, ax=ax) is ax.figure
    axes = Figure().subplots(1, 2)
    gate = gated.unique(subset=["run_id", "task", "input_id"])
    assert F.drop_by_task(gate, ax=axes) is axes[0].figure
    with pytest.raises(ValueError, match="panel"):
        F.drop_by_task(gate, ax=axes[0])
    assert plt.get_fignums() == before


# --------------------------------------------------------------------------- readability fixes
def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_task_key_spells_out_every_abbreviation():
    from pagestats.figures._frames import short_task, task_key

    tasks = ["niah_multikey_3", "niah_single_1", "niah_multiquery", "niah_multivalue", "vt", "fwe", "qa_1"]
    key = task_key(tasks)
    for task in tasks[:4]:
        assert f"{short_task(task)} = {task}" in key
    assert "vt = variable tracking" in key and "fwe = frequent words" in key
    assert "qa_1" not in key  # not abbreviated, nothing to spell out


def test_delta_matrix_says_na_for_missing_cells(gated):
    # m2 has no h2o rows: its h2o cell is "n/a", the other three cells carry numbers
    fig = F.delta_matrix(gated.filter(~((pl.col("model") == "m2") & (pl.col("evictor") == "h2o"))))
    texts = _texts(fig)
    assert texts.count("n/a") == 1
    assert sum(t.startswith(("+", "-", "−")) for t in texts) == 3


def test_panels_show_only_their_cells_tasks(gated):
    # m2 lacks vt: its panel of Figs. 2 and 11 has two task ticks, m1's has three
    sub = gated.filter(~((pl.col("model") == "m2") & (pl.col("task") == "vt")))
    gate = sub.unique(subset=["run_id", "task", "input_id"])
    for fig in (F.drop_by_task(gate), F.recovery_fraction(sub)):
        ticks = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes]
        assert sorted(map(len, ticks)) == [2, 3], ticks
    # Fig. 11 writes k/n on every bar, so a zero share is visibly a measured 0
    fig = F.recovery_fraction(sub)
    data = F.recovery_fraction_data(sub)
    assert sorted(_texts(fig)) == sorted(f"{k}/{n}" for k, n in zip(data["k"], data["n"]))


def test_rho_vs_headroom_labels_every_point():
    g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    fig = F.rho_vs_headroom(g)
    data = F.scaling_data(g)
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert len(labels) == data.height  # one per (model, context, task) row
    assert "MK3 m1 4K" in labels and "vt m2 16K" in labels


def test_tau_sensitivity_says_when_there_is_no_plateau():
    taus = np.linspace(0, 0.2, 41)
    curve = pl.DataFrame({"tau": taus, "delta": taus, "fp_rate": np.full(41, 0.5), "fn_rate": np.full(41, 0.5)})
    fig = F.tau_sensitivity(curve, tau0=0.07)
    assert "no τ meets both plateau criteria" in fig.axes[0].get_title()
    ok = curve.with_columns(pl.lit(0.0).alias("fp_rate"), pl.lit(0.0).alias("fn_rate"), pl.lit(0.1).alias("delta"))
    fig = F.tau_sensitivity(ok, tau0=0.07)
    assert "plateau" not in fig.axes[0].get_title()
    assert any(p.get_width() > 0 for p in fig.axes[0].patches)  # the shaded band


@pytest.mark.parametrize("case", ["hand_gated", "shipped_clash"])
def test_rho_vs_headroom_labels_do_not_overlap(case):
    from pagestats.figures import _style as st
    from pagestats.figures.scaling import _label_points

    if case == "hand_gated":  # 2 models × 2 contexts × 8 tasks: 32 labelled points, many close together
        g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
        fig = F.rho_vs_headroom(g)
        n_points = F.scaling_data(g).height
    else:  # the points of the shipped Fig. 9 whose labels were drawn over each other (vt at 512 and 1K)
        data = pl.DataFrame({"task": ["niah_single_1", "niah_single_1", "vt", "vt", "niah_multikey_3",
                                      "niah_multikey_3"],
                             "context_length": [512, 1024, 1024, 512, 512, 1024],
                             "headroom": [0.0, 0.003, 0.930, 0.945, 0.99, 1.0],
                             "rho": [0.0, 0.0, 0.121, 0.108, 0.0, 0.0]})
        with st.style():
            fig, (axis,) = st.panels(1, None, row_height=2.0)
            axis.scatter(data["headroom"].to_numpy(), data["rho"].to_numpy())
            axis.set_xlim(0, 1.05)
            axis.set_ylim(-0.01, 0.5)
            _label_points(axis, data)
        n_points = data.height
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    assert len(boxes) == n_points
    clashes = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not clashes
    frame = fig.axes[0].get_window_extent()  # no label crosses the axes' bottom (the x axis) or top
    assert all(frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
