"""The real logs shipped in ``data/`` are valid schema-v1 runs and replay consistently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pagestats import io, replay
from pagestats.core import profile

DATA = Path(__file__).resolve().parents[2] / "data"
RUNS = sorted(str(m.parent) for m in DATA.glob("*/manifest.json"))


def test_data_ships_runs():
    assert RUNS, f"no run (manifest.json) under {DATA}"


#: The control runs (Table 31), shipped in data/controls/ so that `whatif data/smollm2-*/` never pools them.
CONTROL_RUNS = sorted(str(m.parent) for m in (DATA / "controls").glob("*/manifest.json"))


@pytest.mark.parametrize("run", RUNS + CONTROL_RUNS, ids=[Path(r).name for r in RUNS + CONTROL_RUNS])
def test_shipped_run_validates(run):
    assert io.validate_paths([run]) == []


#: The collection modes the shipped runs hold (manifest ``mode``; none means query-aware): each is
#: read apart, as the CLI reads it (``--mode``).
MODES = sorted({json.loads((Path(r) / "manifest.json").read_text()).get("mode", "query-aware") for r in RUNS})


@pytest.fixture(scope="module", params=MODES)
def logs(request):
    return io.load(RUNS, mode=request.param)


def test_logged_drop_is_the_replayed_drop(logs):
    # The collector's D and the offline replay's D are the same number, bit for bit.
    replayed = replay.profile_drop(logs).join(logs.inputs.select("run_id", "task", "input_id", "drop"),
                                              on=["run_id", "task", "input_id"], suffix="_logged")
    assert replayed.height == logs.inputs.height
    assert (replayed["drop"] == replayed["drop_logged"]).all()


def test_stored_topk_reproduces_stored_pair_jaccard(logs):
    # Independent path: Jaccards from the stored top-k_max lists truncated to k = 32 (Python sets)
    # against the logged pair_jaccard, for a few inputs of each run.
    for run_id in logs.inputs["run_id"].unique().sort():
        row = logs.inputs.filter(pl.col("run_id") == run_id).row(0, named=True)
        top = logs.topk.filter((pl.col("run_id") == run_id) & (pl.col("task") == row["task"])
                               & (pl.col("input_id") == row["input_id"])).sort("layer", "head")
        n_layers = len(row["agreement"])
        n_heads = top.height // n_layers
        sets = [[set(top.row(layer * n_heads + h, named=True)["indices"][:32]) for h in range(n_heads)]
                for layer in range(n_layers)]
        expected = [len(a & b) / len(a | b) for layer in sets
                    for i, a in enumerate(layer) for b in layer[i + 1:]]
        np.testing.assert_allclose(np.asarray(row["pair_jaccard"], dtype=np.float64), expected, atol=1e-7)
        assert profile.n_pairs(n_heads) * n_layers == len(expected)


def test_gate_identities_on_real_rows(logs):
    # τ = −∞: gated ≡ plain; τ = +∞: gated ≡ full with n_kept = n_tokens (Eq. 2).
    open_all = replay.gated_outcomes(logs, policy=replay.FixedTau(-np.inf))
    assert (open_all["score_gated"] == open_all["score_plain"]).all()
    assert (open_all["n_kept_gated"] == open_all["n_kept_plain"]).all()
    closed = replay.gated_outcomes(logs, policy=replay.FixedTau(np.inf))
    assert (closed["score_gated"] == closed["score_full"]).all()
    assert (closed["n_kept_gated"] == closed["n_tokens"]).all()


def test_report_headline_is_table_28_on_the_same_inputs(logs):
    """The HTML headline and Table 28 compare the evictors on the same inputs: on the shipped logs the
    second SnapKV draw (30 inputs of one evictor only) is left out of both, so they give the same Δ,
    interval and n for every cell (the headline once pooled it into SnapKV's cell alone)."""
    from pagestats import report, tables
    from pagestats.core import defaults
    from pagestats.report.headline import headline

    ctx = report.Context(logs)
    head = headline(ctx)
    t28 = tables.bootstrap_table(ctx.gated.filter(pl.col("budget") < 1.0),
                                 rng=np.random.default_rng(defaults.BOOTSTRAP_SEED))
    joined = head.join(t28, on=["model", "context_length", "evictor"], suffix="_t28")
    assert joined.height == head.height == t28.height
    assert joined["n_inputs"].to_list() == joined["n_inputs_t28"].to_list()
    for c in ("delta", "low", "high"):
        assert joined[c].to_list() == pytest.approx(joined[f"{c}_t28"].to_list(), abs=1e-12)
    snap = joined.filter((pl.col("evictor") == "snapkv") & (pl.col("context_length") == 512))
    assert snap["n_inputs"].item() == snap.join(
        joined.filter(pl.col("evictor") == "h2o"), on=["model", "context_length"])["n_inputs_right"].item()


def test_readme_findings_tables_are_the_logs_numbers():
    """The README's findings tables are written by data/readme_numbers.py from the shipped logs; a
    README edited by hand, or logs changed without rerunning it, fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_numbers", DATA / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0


def test_glossary_formulas_hold_on_the_shipped_logs_report(tmp_path):
    """Every derived column's glossary formula holds on the rows of the report of the shipped logs
    (tables and headline; figures are not needed), where the gate and the oracle differ, harm
    gated is not harm plain, and p_open lies strictly between 0 and 1."""
    from pagestats import report
    from pagestats.report.glossary import formula_checks
    from pagestats.report.table_entries import TABLES

    index = report.build_report(io.load(RUNS, mode="query-aware"), tmp_path / "out", entries=TABLES, formats=("png",))
    checks = formula_checks(Path(index).parent)
    assert [c[:3] for c in checks if not c[3]] == []
    names = {(t, c) for t, c, _, _ in checks}
    assert {("tab14_oracle_gap", "gap"), ("tab27_harm", "harm_ratio"), ("headline", "harm_reduction"),
            ("tabN3_matched_memory", "delta_matched"), ("tab07_calibration", "tau_calibrated")} <= names
    gap = pl.read_csv(Path(index).parent / "tables" / "tab14_oracle_gap.csv")["gap"]
    assert (gap.abs() > 1e-6).any()  # the formula's sign is tested, not 0 = −0


def test_shipped_control_run_is_the_main_runs_prompts():
    """The Table 31 control run repeats draw-0 prompts of data/smollm2-512 (same text, same D), so
    its SnapKV arm is the main run's on the same inputs and the report must set it apart."""
    assert CONTROL_RUNS
    control = io.load(CONTROL_RUNS, columns="all").inputs.select("task", "input_id", "prompt", "drop")
    main = io.load([str(DATA / "smollm2-512")], columns="all").inputs.select("task", "input_id", "prompt", "drop")
    joined = control.join(main, on=["task", "input_id"], suffix="_main")
    assert joined.height == control.height == 40
    assert (joined["prompt"] == joined["prompt_main"]).all() and (joined["drop"] == joined["drop_main"]).all()
