"""Figures: each ``*_data`` function against an independent brute-force computation on a
small hand-built frame, and each figure renders (Agg, PNG) with labelled axes."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
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
    # the figures' one task order: capacity-bound first, then RULER's order (vt before fwe), not by D
    expected = RULER_ORDER
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


def test_many_dots_are_an_image_in_the_pdf_and_the_png_is_unchanged(gated, tmp_path, monkeypatch):
    """Fig. 2 with more dots than RASTER_MARKERS: its PDF holds them as images (each panel its own),
    with fewer as vector paths; the PNG is byte-identical either way."""
    from pagestats.figures import _style

    gate = gated.unique(subset=["run_id", "task", "input_id"])
    written = {}
    for limit in (10**9, 3):
        monkeypatch.setattr(_style, "RASTER_MARKERS", limit)
        written[limit] = [Path(p).read_bytes() for p in
                          _render(F.drop_by_task(gate), tmp_path / str(limit), "fig2", ("png", "pdf"))]
    (png_vector, pdf_vector), (png_raster, pdf_raster) = written[10**9], written[3]
    assert png_vector == png_raster
    assert pdf_vector.count(b"/Subtype /Image") == 0 and pdf_raster.count(b"/Subtype /Image") >= 2  # each with its alpha mask


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
    from pagestats.core.profile import bin_layers

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
    with pytest.raises(ValueError, match="no niah_multikey_3 inputs; Δ\\(f\\) needs both"):
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


def _named_rows(label):
    """The rows a Fig. 9 label names: "S1 m1 4K, m1 16K; vt m2 4K" → "S1 m1 4K", "S1 m1 16K", "vt m2 4K"."""
    rows = []
    for part in label.split("; "):
        task, _, cells = part.partition(" ")
        rows += [f"{task} {cell}" for cell in cells.split(", ")] if cells else [task]
    return rows


def test_rho_vs_headroom_labels_every_point():
    from pagestats.figures._frames import short_task
    from pagestats.figures import cell_label

    g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    fig = F.rho_vs_headroom(g)
    data = F.scaling_data(g)
    labels = [t.get_text() for t in fig.axes[0].texts]
    # every (model, context, task) row is named, once; coinciding points share one label
    named = [part for label in labels for part in _named_rows(label)]
    assert sorted(named) == sorted(f"{short_task(r['task'])} {cell_label(r)}" for r in data.iter_rows(named=True))
    assert "MK3 m1 4K" in named and "vt m2 16K" in named


def test_tau_sensitivity_says_when_there_is_no_plateau():
    taus = np.linspace(0, 0.2, 41)
    curve = pl.DataFrame({"tau": taus, "delta": taus, "fp_rate": np.full(41, 0.5), "fn_rate": np.full(41, 0.5)})
    fig = F.tau_sensitivity(curve, tau0=0.07)
    assert "no τ meets both plateau criteria" in fig.axes[0].get_title()
    ok = curve.with_columns(pl.lit(0.0).alias("fp_rate"), pl.lit(0.0).alias("fn_rate"), pl.lit(0.1).alias("delta"))
    fig = F.tau_sensitivity(ok, tau0=0.07)
    assert "plateau" not in fig.axes[0].get_title()
    assert any(p.get_width() > 0 for p in fig.axes[0].patches)  # the shaded band


def _labelled_scatter(data: pl.DataFrame):
    """Fig. 9's point labels (``scaling._label_points``) on a bare scatter of ``data``: (figure, axis)."""
    from pagestats.figures import _style as st
    from pagestats.figures.scaling import _label_points

    with st.style():
        fig, (axis,) = st.panels(1, None, row_height=2.0)
        axis.scatter(data["headroom"].to_numpy(), data["rho"].to_numpy())
        axis.set_xlim(0, 1.05)
        axis.set_ylim(-0.01, 0.5)
        _label_points(axis, data)
    return fig, axis


@pytest.mark.parametrize("case", ["hand_gated", "shipped_clash"])
def test_rho_vs_headroom_labels_do_not_overlap(case):
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
        fig, axis = _labelled_scatter(data)
        n_points = data.height
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    assert len([row for t in fig.axes[0].texts for row in _named_rows(t.get_text())]) == n_points
    clashes = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not clashes
    frame = fig.axes[0].get_window_extent()  # no label crosses the axes' bottom (the x axis) or top
    assert all(frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)


# --------------------------------------------------------------------------- figures people can read (issue 23)
# Each test below reads what is drawn (the artists' data, colours, limits and rendered boxes), and
# each fails on the figure it fixes as it was before.
RULER_ORDER = ["niah_multikey_3", "vt", "fwe"]  # capacity-bound first, then RULER's order (vt before fwe)


def _renderer(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _view_ticklabels(axis):
    """The tick labels of ``axis`` (an XAxis or YAxis) at ticks inside its view: matplotlib keeps
    labels for the locator's ticks beyond the limits too, and does not draw those."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) or 1.0
    return [label for loc, label in zip(axis.get_majorticklocs(), axis.get_ticklabels())
            if lo - 1e-9 * span <= loc <= hi + 1e-9 * span]


def _shown_texts(fig):
    """Every drawn text of ``fig`` with its rendered box: axes texts, titles, axis labels, the tick
    labels inside the view, legend texts and titles, figure texts."""
    renderer = _renderer(fig)
    texts = []
    for ax in fig.axes:
        ticks = [*_view_ticklabels(ax.xaxis), *_view_ticklabels(ax.yaxis)]
        others = [*ax.texts, ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        if ax.get_legend() is not None:
            others += [*ax.get_legend().get_texts(), ax.get_legend().get_title()]
        texts += ticks + others
    for legend in fig.legends:
        texts += [*legend.get_texts(), legend.get_title()]
    texts += [*fig.texts, *([fig._suptitle] if fig._suptitle else []), *([fig._supxlabel] if fig._supxlabel else [])]
    return [(t, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text().strip()]


def _assert_nothing_clipped(fig):
    """No drawn text leaves the figure (the saved file would cut it)."""
    box = fig.bbox
    out = [t.get_text() for t, b in _shown_texts(fig)
           if b.x0 < box.x0 - 0.5 or b.y0 < box.y0 - 0.5 or b.x1 > box.x1 + 0.5 or b.y1 > box.y1 + 0.5]
    assert not out, f"cut by the figure's edge: {out}"


def _assert_apart(boxes, what):
    clashes = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]
    assert not clashes, f"{what} drawn over each other: {clashes}"


def _assert_ticklabels_apart(axis, renderer, what):
    """The drawn tick labels of ``axis`` do not cover each other: unrotated, their boxes are apart;
    rotated by θ (the parallel labels of Figs. 2 and 11), their baselines are at least one font
    size apart (anchor spacing × |sin θ|: their upright boxes overlap even when the glyphs do not)."""
    ax = axis.axes
    pairs = [(loc, t) for loc, t in zip(axis.get_majorticklocs(), axis.get_ticklabels())
             if t in _view_ticklabels(axis) and t.get_visible() and t.get_text().strip()]
    rotations = {round(t.get_rotation(), 6) % 180 for _, t in pairs}
    if not pairs or rotations <= {0.0} or (axis is ax.yaxis and rotations <= {90.0}):
        _assert_apart([(t.get_text(), t.get_window_extent(renderer)) for _, t in pairs], what)
        return
    assert len(rotations) == 1, rotations
    theta = np.deg2rad(rotations.pop())
    index = 0 if axis is ax.xaxis else 1
    anchors = sorted(ax.transData.transform([(loc, 0) if index == 0 else (0, loc) for loc, _ in pairs])[:, index])
    font = max(t.get_fontsize() for _, t in pairs) * ax.figure.dpi / 72
    gaps = np.diff(anchors) * abs(np.sin(theta) if index == 0 else np.cos(theta))
    assert (gaps >= font).all(), f"{what}: rotated labels {gaps.min():.1f} px apart, font {font:.1f} px"


def _frontier_inputs():
    """A τ curve and accuracy frame for :func:`decision_frontier_data` with accuracies below 0.5."""
    rows, acc = [], []
    for ctx, ev in itertools.product((512, 1024), ("h2o", "snapkv")):
        for b in (0.125, 0.5):
            acc.append(dict(model="m", context_length=ctx, evictor=ev, budget=b, acc_plain=0.1 * b, acc_full=0.4))
            for tau in (-np.inf, 0.0, 0.07, 0.2, np.inf):
                share = 0.0 if tau == -np.inf else 1.0 if tau == np.inf else min(1.0, 0.2 + tau * 3)
                rows.append(dict(model="m", context_length=ctx, evictor=ev, budget=b, tau=tau,
                                 delta=share * (0.4 - 0.1 * b), kept_kv=b + share * (1 - b), p_open=1 - share))
    return pl.DataFrame(rows), pl.DataFrame(acc)


def _many_evictors(gated):
    """``gated`` with its two evictors copied under eight names, as the shipped data (one long)."""
    names = ["h2o", "h2o-perhead", "kvpress:SnapKVPress:window_size=32", "pyramidkv", "snapkv", "snapkv-perhead",
             "snapkv-perlayer", "streamingllm"]
    base = gated.filter(pl.col("evictor") == "snapkv")
    return pl.concat([base.with_columns(pl.lit(n).alias("evictor")) for n in names])


def _nine_tasks_cwe_recovers():
    """The nine shipped tasks (copies of vt), 25 inputs each; every cwe input recovers (k/n = 50/50)."""
    g = hand_gated(seed=0, n=25)
    base = g.filter(pl.col("task") == "vt")
    g = pl.concat([g, *(base.with_columns(pl.lit(t).alias("task")) for t in RULER_9 if t not in TASKS)])
    cwe = pl.col("task") == "cwe"
    return g.with_columns(pl.when(cwe).then(0.0).otherwise(pl.col("score_full")).alias("score_full"),
                          pl.when(cwe & (pl.col("budget") < 1)).then(1.0).otherwise(pl.col("score_gated"))
                          .alias("score_gated"))


def _every_figure(gated):
    gate = gated.unique(subset=["run_id", "task", "input_id"])
    g5 = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    curve, acc = _frontier_inputs()
    return {
        "fig02": F.drop_by_task(gate),
        "fig03": F.accuracy_vs_budget(gated, model="m1", evictor="snapkv"),
        "fig04": F.accuracy_vs_kept_kv(gated, evictor="snapkv"),
        "fig05": F.agreement_profile(_hand_inputs()),
        "fig05_ruler": F.agreement_profile(pl.concat([_ruler_inputs(RULER_9, model=m) for m in LONG_MODELS])),
        "fig06": F.tau_sensitivity(_curve()),
        "fig07": F.delta_of_f(gated),
        "fig08": F.delta_matrix(gated),
        "fig08_many": F.delta_matrix(_many_evictors(gated)),
        "fig09": F.rho_vs_headroom(g5),
        "fig10": F.recovery_distribution(gated),
        "fig11": F.recovery_fraction(gated),
        "fig11_counts": F.recovery_fraction(_nine_tasks_cwe_recovers()),  # tall five-character k/n labels
        "figN1": F.decision_frontier(F.decision_frontier_data(curve, acc)),
    }


@pytest.fixture(scope="module")
def every_figure(gated):
    """Every figure drawn once for the module (the tests below only read them)."""
    return _every_figure(gated)


@pytest.mark.parametrize("name", ["fig02", "fig03", "fig04", "fig05", "fig05_ruler", "fig06", "fig07", "fig08",
                                  "fig08_many", "fig09", "fig10", "fig11", "figN1"])
def test_no_text_is_cut_by_the_figure_edge(every_figure, name):
    # the colour-bar label of Fig. 8 and the y label of Fig. 5 left the figure
    _assert_nothing_clipped(every_figure[name])


@pytest.mark.parametrize("name", ["fig02", "fig03", "fig05", "fig07", "fig08", "fig08_many", "fig10", "fig11",
                                  "figN1"])
def test_tick_labels_do_not_overlap(every_figure, name):
    fig = every_figure[name]
    renderer = _renderer(fig)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            _assert_ticklabels_apart(axis, renderer, f"{name} tick labels")


# ----- Fig. 8
def test_delta_matrix_cell_labels_stay_in_their_cells(gated):
    # eight evictors, one with a 34-character name: the "+12.3" labels ran into each other
    fig = F.delta_matrix(_many_evictors(gated))
    ax = fig.axes[0]
    renderer = _renderer(fig)
    cells = [t for t in ax.texts]
    assert len(cells) == 2 * 8
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in cells]
    _assert_apart(boxes, "cell labels")
    for t, box in zip(cells, (b for _, b in boxes)):
        x, y = t.get_position()
        (x0, y0), (x1, y1) = ax.transData.transform([(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)])
        assert min(x0, x1) <= box.x0 and box.x1 <= max(x0, x1) and min(y0, y1) <= box.y0 and box.y1 <= max(y0, y1)
    # more evictors than (model, context) rows: the evictors are the rows, their names unrotated
    assert [t.get_text() for t in ax.get_yticklabels()][2] == "kvpress:SnapKVPress:window_size=32"
    assert all(t.get_rotation() == 0 for t in [*ax.get_xticklabels(), *ax.get_yticklabels()])
    assert ax.get_ylabel() == "base evictor"


def _shift(gated, by):
    """``gated`` with the gated score set to the plain one plus ``by[model]`` below b = 1."""
    return gated.with_columns(pl.when(pl.col("budget") < 1).then(
        pl.col("score_plain") + pl.col("model").replace_strict(by, return_dtype=pl.Float64))
        .otherwise(pl.col("score_gated")).alias("score_gated"))


@pytest.mark.parametrize("by, cmap, limits", [
    ({"m1": 0.2, "m2": 0.05}, "Blues", (0.0, 20.0)),     # every Δ > 0: sequential from 0
    ({"m1": -0.2, "m2": -0.05}, "Reds_r", (-20.0, 0.0)),  # every Δ < 0: sequential to 0
    ({"m1": 0.2, "m2": -0.05}, "RdBu", (-20.0, 20.0)),   # both signs: diverging, centred at 0
])
def test_delta_matrix_colour_scale_follows_the_signs(gated, by, cmap, limits):
    fig = F.delta_matrix(_shift(gated, by))
    image = fig.axes[0].images[0]
    assert image.cmap.name == cmap
    assert (image.norm.vmin, image.norm.vmax) == pytest.approx(limits)
    data = F.delta_matrix_data(_shift(gated, by))
    assert sorted(data["delta"].to_list()) == pytest.approx(sorted([by["m1"], by["m2"]] * 2))


def test_delta_colour_scale_rules():
    from pagestats.figures.matrix import delta_colour_scale

    assert delta_colour_scale([[3.0, np.nan], [0.0, 12.0]]) == ("Blues", 0.0, 12.0)
    assert delta_colour_scale([[-3.0, -0.5]]) == ("Reds_r", -3.0, 0.0)
    assert delta_colour_scale([[-3.0, 7.5]]) == ("RdBu", -7.5, 7.5)
    assert delta_colour_scale([[0.0, 0.0]]) == ("RdBu", -1.0, 1.0)
    assert delta_colour_scale([[0.2, 0.4]]) == ("Blues", 0.0, 1.0)  # at least 1 pp
    with pytest.raises(ValueError, match="no finite"):
        delta_colour_scale([[np.nan]])


# ----- Fig. N1 / Table N2: the frontier under last-bit noise, and the y range
def test_pareto_mask_is_tolerant_of_last_bit_noise():
    from fractions import Fraction

    rng = np.random.default_rng(11)
    n = 300
    # exact values: accuracies are means of scores in multiples of 1/60, costs few distinct shares
    exact_value = [Fraction(int(k), 60 * 4) for k in rng.integers(0, 60 * 4, n) // 20 * 20]
    exact_cost = [Fraction(int(k), 16) for k in rng.integers(1, 17, n)]
    value = np.array([float(v) for v in exact_value])
    cost = np.array([float(c) for c in exact_cost])
    # the same means summed in another order: a few ulps off
    noisy_value = value + rng.integers(-3, 4, n) * np.spacing(np.maximum(value, 1e-300))
    noisy_cost = cost + rng.integers(-3, 4, n) * np.spacing(cost)
    assert (noisy_value != value).sum() > n // 2
    expected = [not any(exact_cost[j] <= exact_cost[i] and exact_value[j] >= exact_value[i]
                        and (exact_cost[j] < exact_cost[i] or exact_value[j] > exact_value[i]) for j in range(n))
                for i in range(n)]
    assert F.pareto_mask(noisy_cost, noisy_value).tolist() == expected
    assert F.pareto_mask(cost, value).tolist() == expected
    # two means equal up to the last bit, the dearer one is not on the frontier
    assert F.pareto_mask([0.91, 0.92], [0.34506666666666663, 0.3450666666666667]).tolist() == [True, False]
    with pytest.raises(ValueError, match="NaN"):
        F.pareto_mask([0.1, np.nan], [0.2, 0.3])


def test_decision_frontier_drops_points_equal_up_to_noise():
    curve, acc = _frontier_inputs()
    # a point as accurate as a cheaper one but for the last bit: on the frontier before the fix
    twin = curve.filter((pl.col("context_length") == 512) & (pl.col("evictor") == "h2o") & (pl.col("tau") == 0.07)
                        & (pl.col("budget") == 0.5))
    plain = float(acc.filter((pl.col("context_length") == 512) & (pl.col("evictor") == "h2o")
                             & (pl.col("budget") == 0.5))["acc_plain"][0])
    delta = float(twin["delta"][0])
    noisy = delta
    while plain + noisy == plain + delta:  # the same accuracy but for its last bits, summed otherwise
        noisy = float(np.nextafter(noisy, -np.inf))
    cheaper = twin.with_columns(pl.lit(0.0301).alias("tau"), (pl.col("kept_kv") - 0.01).alias("kept_kv"),
                                pl.lit(noisy).alias("delta"))
    data = F.decision_frontier_data(pl.concat([curve, cheaper]), acc)
    sub = data.filter((pl.col("context_length") == 512) & (pl.col("evictor") == "h2o") & (pl.col("budget") == 0.5))
    assert sub.filter(pl.col("tau") == 0.07)["accuracy"][0] != sub.filter(pl.col("tau") == 0.0301)["accuracy"][0]
    assert not sub.filter(pl.col("tau") == 0.07)["on_frontier"][0]
    assert sub.filter(pl.col("tau") == 0.0301)["on_frontier"][0]


def test_decision_frontier_y_range_is_the_data_range():
    from pagestats.figures.decision import accuracy_range

    curve, acc = _frontier_inputs()
    data = F.decision_frontier_data(curve, acc)
    fig = F.decision_frontier(data)
    lo, hi = float(data["accuracy"].min()), max(float(data["accuracy"].max()), float(data["acc_full"].max()))
    assert hi < 0.5
    for ax in fig.axes[:2]:
        y0, y1 = ax.get_ylim()
        assert (y0, y1) == pytest.approx(accuracy_range(data))
        assert y0 < lo and y1 > hi  # every point is shown ...
        assert y1 - y0 < 1.2 * (hi - lo)  # ... and they fill the panel (it was −0.02 … 1.02)
        for line in ax.get_lines():
            y = np.asarray(line.get_ydata(), float)
            assert ((y >= y0) & (y <= y1)).all()


# ----- Fig. 5
LONG_MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-1.5B-Instruct")  # names as long as the shipped data's
RULER_9 = ["niah_single_1", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue",
           "niah_multiquery", "vt", "cwe", "fwe"]  # the tasks of the shipped data


def _ruler_inputs(tasks, model="m1"):
    rng = np.random.default_rng(2)
    rows = [dict(model=model, context_length=4096, task=t, task_class="capacity-bound" if t in (
                 "niah_multikey_3", "niah_multiquery") else "dilution-prone", input_id=i,
                 agreement=rng.uniform(0.1, 0.5, 8).astype(np.float32).tolist()) for t in tasks for i in range(2)]
    return pl.DataFrame(rows, schema_overrides={"agreement": pl.List(pl.Float32)})


@pytest.mark.parametrize("n_tasks", [9, 11])
def test_agreement_profile_tells_every_task_apart(n_tasks):
    from pagestats.core import defaults

    tasks = list(defaults.RULER_TASKS[:n_tasks])
    fig = F.agreement_profile(_ruler_inputs(tasks))
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert len(lines) == n_tasks
    styles = [(mpl_colour(ln.get_color()), ln.get_linestyle()) for ln in lines]
    assert len(set(styles)) == n_tasks  # no two tasks alike (the viridis greens were)
    colours = [c for c, _ in styles]
    assert len(set(colours)) == min(n_tasks, 10)  # ten distinct hues before a line style repeats one
    # the capacity-bound tasks are drawn in the warm hues
    from pagestats.figures._style import WARM_HUES

    by_label = dict(zip([ln.get_label() for ln in lines], colours))
    assert by_label["MK3"] in {mpl_colour(c) for c in WARM_HUES} and by_label["MQ"] in {mpl_colour(c) for c in WARM_HUES}


def mpl_colour(c):
    import matplotlib.colors as mcolors

    return mcolors.to_hex(c)


def test_task_styles_refuses_more_lines_than_it_can_tell_apart():
    from pagestats.figures._style import task_styles

    styles = task_styles([f"t{i}" for i in range(40)])
    assert len({(s["color"], s["linestyle"]) for s in styles.values()}) == 40
    with pytest.raises(ValueError, match="told apart"):
        task_styles([f"t{i}" for i in range(41)])


# ----- Fig. 7
@pytest.mark.parametrize("case", ["hand", "steep"])
def test_delta_of_f_legend_is_off_the_lines(gated, case):
    if case == "steep":  # Δ high on the dilution-prone tasks, 0 on the capacity-bound: lines from the top left
        gated = gated.with_columns(pl.when((pl.col("budget") < 1) & (pl.col("task_class") == "dilution-prone"))
                                   .then(pl.col("score_plain") + pl.col("model").replace_strict(
                                       {"m1": 0.9, "m2": 0.7}, return_dtype=pl.Float64))
                                   .when(pl.col("budget") < 1).then(pl.col("score_plain"))
                                   .otherwise(pl.col("score_gated")).alias("score_gated"))
    fig = F.delta_of_f(gated)
    ax = fig.axes[0]
    renderer = _renderer(fig)
    legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    for line in ax.get_lines():
        xy = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        inside = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
        assert not inside.any(), f"the legend covers {line.get_label()}"
        # the lines are sampled every 0.05 of f: check the segments between the samples as well
        xs = np.linspace(xy[:, 0].min(), xy[:, 0].max(), 200)
        ys = np.interp(xs, xy[:, 0], xy[:, 1]) if len(xy) > 1 else np.full_like(xs, xy[0, 1])
        assert not ((xs >= box.x0) & (xs <= box.x1) & (ys >= box.y0) & (ys <= box.y1)).any()


# ----- Fig. 9
def test_rho_vs_headroom_one_label_per_pile_and_clear_of_markers():
    # two cells of S1 both at (0, 0), the pile of the shipped figure: one label names both
    g = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    data = F.scaling_data(g)
    fig = F.rho_vs_headroom(g)
    ax = fig.axes[0]
    renderer = _renderer(fig)
    labels = [t for t in ax.texts]
    xy = ax.transData.transform(np.column_stack([data["headroom"].to_numpy(), data["rho"].to_numpy()]))
    same = {}
    for i, p in enumerate(map(tuple, np.round(xy, 6))):
        same.setdefault(p, []).append(i)
    piles = [v for v in same.values() if len(v) > 1]
    assert piles, "the hand data have coinciding points"
    assert len(labels) < data.height
    texts = " ".join(t.get_text() for t in labels)
    several = ["model", "context_length"]
    from pagestats.figures._frames import short_task
    from pagestats.figures import cell_label

    for row in data.iter_rows(named=True):  # every row is named in some label
        cell = cell_label({k: row[k] for k in several})
        assert any(t.get_text().startswith(short_task(row["task"])) or f"; {short_task(row['task'])} " in t.get_text()
                   for t in labels), row
        model, ctx = cell.split(" ")
        assert model in texts and ctx in texts
    boxes = [t.get_window_extent(renderer) for t in labels]
    _assert_apart([(t.get_text(), b) for t, b in zip(labels, boxes)], "Fig. 9 labels")
    radius = 1.8 * fig.dpi / 72  # the markers (s = 14 pt²) are 3.7 pt wide
    from matplotlib.transforms import Bbox

    for x, y in xy:
        marker = Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)
        assert not any(b.overlaps(marker) for b in boxes), (x, y)


def test_rho_vs_headroom_pile_label_names_each_cell_once():
    data = pl.DataFrame({"task": ["niah_single_1", "niah_single_1", "vt"], "context_length": [512, 1024, 512],
                         "headroom": [0.0, 0.0, 0.6], "rho": [0.0, 0.0, 0.2]})
    _, axis = _labelled_scatter(data)
    assert sorted(t.get_text() for t in axis.texts) == ["S1 512, 1K", "vt 512"]


# ----- Fig. 10
def test_recovery_distribution_caption_defines_r():
    from pagestats.report.figure_entries import FIGURES

    caption = next(e.caption for e in FIGURES if e.name == "fig10_recovery_distribution")
    assert "r(x) = sign(max_b A_gated(b, x) − A_plain(1, x))" in caption
    assert "∈ {−1, 0, +1}" in caption and "b = 1.0" in caption


# ----- one task order
def test_task_order_is_fixed():
    from pagestats.figures._frames import task_order

    frame = pl.DataFrame({"task": ["qa_1", "zz_custom", "fwe", "vt", "niah_multiquery", "niah_multikey_3", "cwe",
                                   "niah_single_1"],
                          "task_class": ["dilution-prone"] * 4 + ["capacity-bound"] * 2 + ["dilution-prone"] * 2})
    assert task_order(frame) == ["niah_multikey_3", "niah_multiquery", "niah_single_1", "vt", "cwe", "fwe", "qa_1",
                                 "zz_custom"]
    assert task_order(frame.drop("task_class"))[:3] == ["niah_single_1", "niah_multikey_3", "niah_multiquery"]


def test_every_figure_lists_tasks_in_the_one_order(gated, every_figure):
    from pagestats.figures._frames import short_task

    order = [short_task(t) for t in RULER_ORDER]
    # vt's D lies below fwe's: the order by mean D (the old Fig. 2) put fwe first
    gate = gated.unique(subset=["run_id", "task", "input_id"]).with_columns(
        pl.when(pl.col("task") == "vt").then(pl.col("drop") + 0.5).otherwise(pl.col("drop")).alias("drop"))
    figs = every_figure
    fig2 = F.drop_by_task(gate)
    for ax in fig2.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == order
    assert [ax.get_title().split(" ")[0] for ax in figs["fig03"].axes] == order
    assert [ax.get_title().split(" ")[0] for ax in figs["fig10"].axes] == order
    for ax in figs["fig11"].axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == order
    assert [t.get_text() for t in figs["fig05"].legends[0].get_texts()] == order
    assert [ln.get_label() for ln in figs["fig05"].axes[0].get_lines() if not ln.get_label().startswith("_")] == order
    # the key to the abbreviations follows it too
    assert figs["fig09"].legends[0].get_title().get_text().index("MK3") < \
        figs["fig09"].legends[0].get_title().get_text().index("vt")


def test_bottom_panel_of_every_column_has_x_tick_labels(gated):
    # five tasks on three columns: the third column's only panel is in the first row
    five = pl.concat([gated, gated.filter(pl.col("task") == "vt").with_columns(pl.lit("cwe").alias("task")),
                      gated.filter(pl.col("task") == "vt").with_columns(pl.lit("qa_1").alias("task"))])
    fig = F.accuracy_vs_budget(five, model="m1", evictor="snapkv")
    renderer = _renderer(fig)
    assert len(fig.axes) == 5
    for ax in fig.axes:
        if ax.get_xlabel():  # the panels that name the axis show its ticks
            shown = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()
                     and t.get_window_extent(renderer).width > 0]
            assert shown, ax.get_title()
    assert fig.axes[2].get_xlabel() == "KV budget b"


@pytest.mark.parametrize("name", ["fig08", "fig08_many", "fig09", "fig10", "fig11", "fig11_counts"])
def test_annotations_stay_inside_their_axes(every_figure, name):
    # the counts of Figs. 10-11, the cell values of Fig. 8 and the labels of Fig. 9 are drawn within their panel
    fig = every_figure[name]
    renderer = _renderer(fig)
    for ax in fig.axes:
        frame = ax.get_window_extent(renderer)
        for t in ax.texts:
            b = t.get_window_extent(renderer)
            assert frame.x0 - 0.5 <= b.x0 and b.x1 <= frame.x1 + 0.5 and frame.y0 - 0.5 <= b.y0 and b.y1 <= frame.y1 + 0.5, \
                (name, t.get_text())


@pytest.mark.parametrize("transposed", [False, True])
def test_delta_matrix_wraps_a_very_long_name(gated, transposed):
    # a 300-letter evictor name (the fuzz's labels): wrapped to LABEL_WIDTH, the figure not 15 in wide
    from pagestats.figures.matrix import LABEL_WIDTH

    long = "e" * 300
    frame = _many_evictors(gated) if transposed else gated
    fig = F.delta_matrix(frame.with_columns(pl.when(pl.col("evictor") == "snapkv").then(pl.lit(long))
                                            .otherwise(pl.col("evictor")).alias("evictor")))
    ax = fig.axes[0]
    labels = [t.get_text() for t in (ax.get_yticklabels() if transposed else ax.get_xticklabels())]
    wrapped = next(t for t in labels if t.startswith("e"))
    assert wrapped.replace("\n", "") == long and max(map(len, wrapped.split("\n"))) <= LABEL_WIDTH
    assert fig.get_figwidth() < 8
    _assert_nothing_clipped(fig)
    renderer = _renderer(fig)
    for axis in (ax.xaxis, ax.yaxis):
        _assert_ticklabels_apart(axis, renderer, "Fig. 8 tick labels")


def _stamp(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


@pytest.mark.parametrize("name", ["fig02", "fig03", "fig04", "fig05", "fig07", "fig08", "fig09", "fig10", "fig11"])
def test_every_figure_states_its_n_and_tau(every_figure, gated, name):
    """Each figure's top line says how many inputs it draws on (counted here) and at which τ."""
    g5 = hand_gated(seed=5, contexts=(4096, 16384), evictors=("snapkv",), n=8)
    frames = {"fig03": gated.filter((pl.col("model") == "m1") & (pl.col("evictor") == "snapkv")),
              "fig04": gated.filter(pl.col("evictor") == "snapkv"), "fig09": g5}
    frame = frames.get(name, gated)
    if name == "fig05":
        frame = _hand_inputs()
    n = len({(r.get("run_id"), r["task"], r["input_id"]) for r in frame.to_dicts()})
    text = _stamp(every_figure[name])
    assert text.startswith(f"n = {n:,} inputs; "), text
    taus = {r["tau"] for r in frame.to_dicts()} if "tau" in frame.columns else set()
    if name in ("fig05", "fig09"):  # no gate decision drawn: the stamp says there is no τ
        assert "no τ" in text
    else:
        assert taus == {0.07} and text.endswith("τ = 0.07"), text


def test_tau_curves_state_their_n_and_the_sweep():
    curve = _curve().with_columns(pl.when(pl.col("model") == "m1").then(30).otherwise(20).alias("n_inputs"))
    assert _stamp(F.tau_sensitivity(curve)) == "n = 50 inputs; τ swept 0 to 0.2, τ0 = 0.07"
    points, acc = _frontier_inputs()
    points = points.with_columns(pl.when(pl.col("context_length") == 512).then(12).otherwise(7).alias("n_inputs"))
    text = _stamp(F.decision_frontier(F.decision_frontier_data(points, acc)))
    assert text == "n = 19 inputs; every τ of the sweep, circles at τ = 0.07"


def test_a_varying_tau_is_stated_as_its_range(gated):
    varied = gated.with_columns(pl.when(pl.col("model") == "m1").then(0.05).otherwise(0.09).alias("tau"))
    assert _stamp(F.delta_of_f(varied)).endswith("τ = 0.05–0.09 (per calibration group)")
