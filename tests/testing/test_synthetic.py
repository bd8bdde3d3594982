"""Tests of pagestats.testing.synthetic_logs against brute-force references written here."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from pagestats.core import defaults, schema
from pagestats.testing import SIGMA_BITS, ClassEffect, ModelSpec, PlantedEffect, planted_rates, synthetic_logs

K = defaults.TOP_K
SMALL = dict(
    models=(ModelSpec("tiny-a", 6, 3), ModelSpec("tiny-b", 5, 4)),
    context_lengths=(1024,),
    evictors=("snapkv", "streamingllm"),
    tasks=("niah_multikey_3", "vt"),
    n_inputs=6,
    k_max=40,
    seed=7,
)


@pytest.fixture(scope="module")
def small():
    return synthetic_logs(**SMALL)


@pytest.fixture(scope="module")
def written(small, tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return small, small.write(root, n_shards=2)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- schema


def test_written_files_are_schema_valid_and_round_trip(written):
    logs, runs = written
    assert len(runs) == len(SMALL["models"]) == len(logs.manifests)
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        assert set(schema.MANIFEST_KEYS) <= set(manifest)
        assert set(schema.MANIFEST_MODEL_KEYS) <= set(manifest["model"])
        assert set(schema.MANIFEST_GATE_KEYS) <= set(manifest["gate"])
        assert set(schema.MANIFEST_PROTECTION_KEYS) <= set(manifest["protection"])
        assert manifest["schema_version"] == schema.SCHEMA_VERSION
        assert manifest["run_id"] == run.name
        assert manifest["gate"]["k_max_stored"] == SMALL["k_max"]
        assert manifest["tasks"] == {"niah_multikey_3": "capacity-bound", "vt": "dilution-prone"}
        listed = {f["path"] for f in manifest["files"]}
        on_disk = {p.relative_to(run).as_posix() for p in run.glob("*/*.parquet")}
        assert listed == on_disk and len(on_disk) == 6  # 3 tables × 2 shards
        for f in manifest["files"]:
            path = run / f["path"]
            assert f["sha256"] == _sha(path)
            table = f["path"].split("/")[0]
            arrow = pq.read_table(path)
            assert arrow.num_rows == f["rows"] > 0
            assert schema.schema_problems(table, arrow.schema) == []
            # the writer's exact types, not just acceptable ones
            for col in schema.columns(table):
                if col.name != "signals":
                    assert arrow.schema.field(col.name).type == col.arrow_type, (table, col.name)
            assert all(t == pl.Float64 for t in pl.from_arrow(arrow).schema.get("signals", pl.Struct([])).to_schema().values())
        for table, frame in (("inputs", logs.inputs), ("outcomes", logs.outcomes), ("topk", logs.topk)):
            back = pl.read_parquet(sorted(run.glob(f"{table}/*.parquet")))
            mine = frame.filter(pl.col("run_id") == run.name)
            key = list({"inputs": schema.INPUT_KEY, "outcomes": schema.OUTCOME_KEY, "topk": schema.TOPK_KEY}[table])
            assert back.sort(key).equals(mine.sort(key)), table
    # one run per (model, context, draw); input identity unique
    assert logs.inputs.select(schema.INPUT_KEY).is_unique().all()
    assert logs.outcomes.select(schema.OUTCOME_KEY).is_unique().all()


def test_write_refuses_to_overwrite(written, tmp_path):
    logs, runs = written
    with pytest.raises(FileExistsError):
        logs.write(runs[0].parent)
    logs.write(tmp_path)
    assert logs.write(tmp_path, overwrite=True)


def test_validates_with_pagestats_io(written, tmp_path):
    if importlib.util.find_spec("pagestats.io") is None:
        pytest.skip("pagestats.io is not in the repository yet")
    from pagestats import io

    if not hasattr(io, "validate_paths"):
        pytest.skip("pagestats.io has no validate_paths yet")
    _, runs = written
    assert io.validate_paths([str(r) for r in runs]) == []
    fast = synthetic_logs(**{**SMALL, "with_topk": False, "with_text": False, "input_draws": (0, 5)})
    fast_runs = fast.write(tmp_path)
    assert len(fast_runs) == 4
    assert io.validate_paths([str(r) for r in fast_runs]) == []


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes(written, tmp_path):
    logs, runs = written
    again = synthetic_logs(**SMALL)
    for name in ("inputs", "outcomes", "topk"):
        assert getattr(again, name).equals(getattr(logs, name))
    runs2 = again.write(tmp_path)
    for a, b in zip(runs, runs2):
        assert (a / "manifest.json").read_text() == (b / "manifest.json").read_text()
    other = synthetic_logs(**{**SMALL, "seed": 8})
    assert not other.inputs["drop"].equals(logs.inputs["drop"])


def test_topk_and_text_switches_do_not_change_other_columns(small):
    fast = synthetic_logs(**{**SMALL, "with_topk": False, "with_text": False})
    assert fast.topk is None
    assert fast.outcomes.drop("prediction").equals(small.outcomes.drop("prediction"))
    same = ["run_id", "task", "input_id", "n_tokens", "drop", "agreement", "pair_jaccard", "full_score", "prefill_ms"]
    assert fast.inputs.select(same).equals(small.inputs.select(same))
    assert (fast.inputs["prompt"] == "").all() and (fast.inputs["references"].list.len() == 0).all()


# --------------------------------------------------------------------------- consistency identities


def _hand_drop(a):
    third = len(a) // 3
    early = [float(x) for x in a[:third]]
    late = [float(x) for x in a[len(a) - third :]]
    return sum(early) / len(early) - sum(late) / len(late)


def test_profile_matches_brute_force_sets(small):
    spec = {m.name: m for m in SMALL["models"]}
    checked = 0
    for row in small.inputs.head(4).vstack(small.inputs.tail(4)).iter_rows(named=True):
        L, H = spec[row["model"]].n_layers, spec[row["model"]].n_heads
        tk = small.topk.filter(
            (pl.col("run_id") == row["run_id"]) & (pl.col("task") == row["task"]) & (pl.col("input_id") == row["input_id"])
        )
        assert tk.height == L * H
        lists = {(r["layer"], r["head"]): r["indices"] for r in tk.iter_rows(named=True)}
        jac, agreement = [], []
        for layer in range(L):
            layer_j = []
            for i, j in itertools.combinations(range(H), 2):  # (i<j) lexicographic
                a, b = set(lists[layer, i][:K]), set(lists[layer, j][:K])
                layer_j.append(len(a & b) / len(a | b))
            jac += layer_j
            agreement.append(sum(layer_j) / len(layer_j))
        for idx in lists.values():
            assert len(idx) == SMALL["k_max"] == len(set(idx))
            assert 0 <= min(idx) and max(idx) < row["n_tokens"]
        np.testing.assert_array_equal(np.float32(jac), np.float32(row["pair_jaccard"]))
        np.testing.assert_allclose(row["agreement"], agreement, rtol=1e-6)
        assert math.isclose(row["drop"], _hand_drop(row["agreement"]), rel_tol=1e-12, abs_tol=1e-12)
        checked += 1
    assert checked == 8


def test_sharing_rule_gives_binomial_intersections():
    """Constant target J*: a pair's intersection is Binomial(k, σ²), σ = round(√π·2^B)/2^B, π = 2J*/(1+J*)."""
    target = 0.3
    flat = ClassEffect(
        drop_mean=0.0, drop_sd=0.0, p_full=0.7, harm_scale=0.1, harm_power=2.0, recovery_scale=0.4,
        level_low=target, level_high=target,
    )  # fmt: skip
    logs = synthetic_logs(
        models=(ModelSpec("m", 3, 8),), tasks=("vt",), evictors=("snapkv",), n_inputs=600,
        with_topk=False, with_text=False, effect=PlantedEffect(dilution_prone=flat),
    )  # fmt: skip
    pj = np.stack(logs.inputs["pair_jaccard"].to_numpy()).astype(np.float64).reshape(600, 3, 28)
    inter = np.rint(2 * K * pj / (1 + pj))[:, :, 0].ravel()  # pair (0, 1) of each layer: independent draws
    pi = 2 * target / (1 + target)
    q = (round(math.sqrt(pi) * 2**SIGMA_BITS) / 2**SIGMA_BITS) ** 2
    n = inter.size
    mean, var = K * q, K * q * (1 - q)
    assert abs(inter.mean() - mean) < 4 * math.sqrt(var / n)
    assert abs(inter.var() / var - 1) < 5 * math.sqrt(2 / n)
    # pairs sharing a head are positively correlated: Cov = k(σ³ − σ⁴)
    a, b = np.rint(2 * K * pj / (1 + pj))[:, :, 0].ravel(), np.rint(2 * K * pj / (1 + pj))[:, :, 1].ravel()
    sigma = math.sqrt(q)
    assert abs(np.cov(a, b)[0, 1] - K * (sigma**3 - sigma**4)) < 5 * var / math.sqrt(n)


def test_fast_path_values_are_jaccards_of_k_sets():
    logs = synthetic_logs(**{**SMALL, "with_topk": False, "n_inputs": 30})
    for row in logs.inputs.iter_rows(named=True):
        H = {m.name: m.n_heads for m in SMALL["models"]}[row["model"]]
        P = H * (H - 1) // 2
        pj = np.asarray(row["pair_jaccard"], dtype=np.float64)
        a = np.asarray(row["agreement"], dtype=np.float64)
        assert pj.size == a.size * P
        inter = 2 * K * pj / (1 + pj)  # invert J = i/(2k−i)
        np.testing.assert_allclose(inter, np.round(inter), atol=1e-4)
        assert ((0 <= inter) & (inter <= K + 1e-6)).all()
        layer_means = [sum(pj[layer * P : (layer + 1) * P]) / P for layer in range(a.size)]
        np.testing.assert_allclose(a, layer_means, rtol=1e-6)
        assert math.isclose(row["drop"], _hand_drop(row["agreement"]), rel_tol=1e-12, abs_tol=1e-12)


def test_outcome_rules(small):
    o = small.outcomes.join(
        small.inputs.select("run_id", "task", "input_id", "n_tokens", "full_score", "references"),
        on=["run_id", "task", "input_id"],
    )
    assert o.height == small.inputs.height * len(SMALL["evictors"]) * len(defaults.BUDGETS)
    for r in o.iter_rows(named=True):
        expected_kept = max(math.floor(r["budget"] * r["n_tokens"]), defaults.N_SINK + defaults.N_RECENT)
        if r["budget"] == 1.0:
            assert r["n_kept"] == r["n_tokens"] and r["score"] == r["full_score"]
        assert r["n_kept"] == expected_kept
        refs = r["references"]
        m = {"niah_multikey_3": 1, "vt": 5}[r["task"]]
        assert len(refs) == m
        # RULER string_match_all: fraction of references found in the prediction
        found = sum(ref.lower() in r["prediction"].lower() for ref in refs) / m
        assert 0.0 <= r["score"] <= 1.0 and r["score"] == found
    for r in small.inputs.iter_rows(named=True):
        found = sum(ref in r["full_prediction"] for ref in r["references"]) / len(r["references"])
        assert r["full_score"] == found
        assert len(r["signals"]) >= 5 and all(isinstance(v, float) for v in r["signals"].values())
        assert r["prefill_ms"] > 0 and r["gate_ms"] > 0


# --------------------------------------------------------------------------- planted partition


def _closed_form(effect: PlantedEffect, cls: str, b: float):
    ce = effect.capacity_bound if cls == defaults.CAPACITY_BOUND else effect.dilution_prone
    harm = ce.p_full * min(1.0, ce.harm_scale * (1 - b) ** ce.harm_power)
    rec = (1 - ce.p_full) * min(1.0, ce.recovery_scale * 4 * b * (1 - b))
    rho = (1 - ce.p_full) * max(min(1.0, ce.recovery_scale * 4 * x * (1 - x)) for x in defaults.BUDGETS if x < 1)
    return harm, rec, rho


@pytest.fixture(scope="module")
def big():
    return synthetic_logs(
        models=(ModelSpec("m", 12, 4),),
        evictors=("snapkv",),
        tasks=("niah_multikey_3", "vt"),
        n_inputs=3000,
        with_topk=False,
        with_text=False,
        seed=3,
    )


def test_planted_rates_match_closed_form(big):
    rates = big.planted_rates()
    assert rates.height == 2 * len(defaults.BUDGETS)
    for r in rates.iter_rows(named=True):
        harm, rec, rho = _closed_form(big.effect, r["task_class"], r["budget"])
        assert r["harm_probability"] == pytest.approx(harm, abs=1e-12)
        assert r["recovery_probability"] == pytest.approx(rec, abs=1e-12)
        assert r["rho"] == pytest.approx(rho, abs=1e-12)
    rho = dict(rates.select("task", "rho").unique().iter_rows())
    assert rho["niah_multikey_3"] == 0.0 and rho["vt"] >= defaults.RHO_THRESHOLD


def test_planted_partition_is_visible(big):
    d = dict(big.inputs.group_by("task").agg(pl.col("drop").mean()).iter_rows())
    assert d["niah_multikey_3"] < defaults.TAU < d["vt"]
    assert abs(d["niah_multikey_3"] - 0.02) < 0.01 and abs(d["vt"] - 0.12) < 0.01
    # dilution-prone profiles decay with depth: early layers agree more than late ones
    prof = np.stack(big.inputs.filter(pl.col("task") == "vt")["agreement"].to_numpy())
    assert prof[:, :4].mean() > prof[:, -4:].mean() + 0.08

    o = big.outcomes.join(big.inputs.select("task", "input_id", "full_score"), on=["task", "input_id"])
    n = 3000
    for task, cls in (("niah_multikey_3", "capacity-bound"), ("vt", "dilution-prone")):
        sub = o.filter(pl.col("task") == task)
        for b in defaults.BUDGETS:
            at_b = sub.filter(pl.col("budget") == b)
            harm, rec, _ = _closed_form(big.effect, cls, b)
            emp_harm = (at_b["score"] < at_b["full_score"]).mean()
            emp_rec = (at_b["score"] > at_b["full_score"]).mean()
            for emp, p in ((emp_harm, harm), (emp_rec, rec)):
                assert abs(emp - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12, (task, b, emp, p)
        # ρ (Eq. 1): some budget beats the full cache
        best = sub.group_by("input_id").agg(pl.col("score").max(), pl.col("full_score").first())
        emp_rho = (best["score"] > best["full_score"]).mean()
        _, _, rho = _closed_form(big.effect, cls, 1.0)
        assert abs(emp_rho - rho) <= 4 * math.sqrt(rho * (1 - rho) / n) + 1e-12, (task, emp_rho, rho)
        # capacity-bound collapses: accuracy falls as the budget shrinks
        acc = sub.group_by("budget").agg(pl.col("score").mean()).sort("budget")["score"].to_list()
        if cls == "capacity-bound":
            assert all(x < y for x, y in zip(acc, acc[1:]))


# --------------------------------------------------------------------------- inputs and errors


def test_models_as_mapping_and_draws():
    logs = synthetic_logs(
        models={"a": (4, 2), "b": {"n_layers": 3, "n_heads": 3}},
        context_lengths=(512, 1024),
        input_draws=(0, 1),
        tasks=("vt",),
        evictors=("snapkv",),
        n_inputs=2,
        k_max=32,
    )
    assert len(logs.manifests) == 2 * 2 * 2
    assert sorted(logs.inputs["draw"].unique().to_list()) == [0, 1]
    lengths = logs.inputs.select("model", pl.col("agreement").list.len(), pl.col("pair_jaccard").list.len()).unique()
    assert sorted(lengths.rows()) == [("a", 4, 4), ("b", 3, 9)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"budgets": (0.5, 0.25)}, "1.0"),
        ({"budgets": (0.0, 1.0)}, r"\(0, 1\]"),
        ({"k_max": 16}, "k_max"),
        ({"context_lengths": (128,)}, "n_tokens"),
        ({"context_lengths": (30,), "with_topk": False}, "protected"),
        ({"task_classes": {"vt": "easy", "niah_multikey_3": "capacity-bound"}}, "task_classes"),
        ({"task_classes": {"vt": "dilution-prone"}}, "no class"),
        ({"n_inputs": 0}, "n_inputs"),
        ({"models": {"x": (1, 4)}}, "n_layers"),
        ({"evictors": "snapkv"}, "evictors"),
        ({"input_draws": (1, 1)}, "duplicates"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_logs(**{**SMALL, **kwargs})


def test_planted_rates_evictor_multiplier():
    effect = PlantedEffect(evictor_harm={"streamingllm": 3.0})
    rates = planted_rates(tasks=("vt",), evictors=("snapkv", "streamingllm"), effect=effect)
    at = {(r["evictor"], r["budget"]): r["harm_probability"] for r in rates.iter_rows(named=True)}
    ce = effect.dilution_prone
    assert at["streamingllm", 0.5] == pytest.approx(ce.p_full * min(1, 3 * ce.harm_scale * 0.25))
    assert at["snapkv", 0.5] == pytest.approx(ce.p_full * ce.harm_scale * 0.25)
    assert at["snapkv", 1.0] == 0.0
