"""The conformance table (issue 40 §2): the paper's printed values beside ours.

Unit tests run on small gated frames written out row by row here, with every expected value worked
out by hand in the comments; the release tests run on the shipped condensed copy of the paper's
logs, imported, with the expected values typed from the paper (never produced by the code under test).
"""

from __future__ import annotations

import io as _io
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pagestats import io, replay, testing
from pagestats.core import defaults
from pagestats.io.imports import import_page
from pagestats.replay import FixedTau
from pagestats.report.conformance import conformance
from pagestats.report.context import Context
from pagestats.tables import conformance as cf

PAPER_HEADER = ("item,quantity,model,context_length,evictor,task,budget,paper_value,ci_low,ci_high,decimals,source,"
                "cells,batch_size\n")


def _paper(text: str) -> pl.DataFrame:
    return cf.paper_values(_io.StringIO(PAPER_HEADER + text))


def _row(model, evictor, task, input_id, budget, gate_open, full, plain, n_tokens=100):
    kept = int(n_tokens * budget)
    gated = plain if gate_open else full
    return dict(run_id=f"run-{model}", task=task, input_id=input_id, model=model, context_length=4096,
                task_class=defaults.default_task_class(task), evictor=evictor, budget=budget, n_tokens=n_tokens,
                drop=0.1, tau=0.07, gate_open=gate_open, score_full=float(full), score_plain=float(plain),
                score_gated=float(gated), n_kept_plain=kept, n_kept_gated=kept if gate_open else n_tokens)


def _hand_frame(flip: bool = False) -> pl.DataFrame:
    """Cell M (snapkv, and h2o for the audit), two tasks, budgets 0.5 and 1.0; cell N (snapkv), vt only.

    M at b = 0.5 (input: gate, full, plain -> gated):
      niah_multikey_3  0: closed, 1, 0 -> 1    1: open, 1, 0 -> 0
      vt               2: open,   0, 1 -> 1    3: open, 1, 1 -> 1
    plain 2/4 = 0.5; gated 3/4 = 0.75; Δ 0.25; p_open 3/4; kept (gated) 1, .5, .5, .5 -> 0.625.
    N at b = 0.5: inputs 4, 5 closed, full 1, plain 0 -> gated 1 on both: Δ = 1 on every input.
    ``flip``: snapkv's plain score of input 3 at b = 0.5 planted to 0 (plain 1/4, gated 1/2; the gate is open
    there, so Δ stays 0.25).
    """
    rows = []
    for i, (task, gate, full, plain) in enumerate([("niah_multikey_3", False, 1, 0), ("niah_multikey_3", True, 1, 0),
                                                    ("vt", True, 0, 1), ("vt", True, 1, 1)]):
        rows.append(_row("M", "snapkv", task, i, 0.5, gate, full, 0 if flip and i == 3 else plain))
        rows.append(_row("M", "snapkv", task, i, 1.0, gate, full, full))
        # h2o equals snapkv on every evicting row but input 2's
        rows.append(_row("M", "h2o", task, i, 0.5, gate, full, 0 if i == 2 else plain))
        rows.append(_row("M", "h2o", task, i, 1.0, gate, full, full))
    for i in (4, 5):
        rows.append(_row("N", "snapkv", "vt", i, 0.5, False, 1, 0))
        rows.append(_row("N", "snapkv", "vt", i, 1.0, False, 1, 1))
    return pl.DataFrame(rows)


def _table(paper: pl.DataFrame, gated: pl.DataFrame | None = None) -> pl.DataFrame:
    return cf.conformance_table(_hand_frame() if gated is None else gated, rng=np.random.default_rng(0), paper=paper,
                                n_boot=2_000)


HAND = (
    # the values below are worked out by hand in _hand_frame's docstring
    "T,plain,M,4096,snapkv,niah_multikey_3;vt,b<1,0.50,,,2,s,,\n"
    "T,gated,M,4096,snapkv,niah_multikey_3;vt,b<1,0.75,,,2,s,,\n"
    "T,plain,M,4096,snapkv,niah_multikey_3;vt,M=2048,0.50,,,2,s,,\n"          # 2048 tokens of 4096: b = 0.5
    "T,delta,M,4096,snapkv,niah_multikey_3;vt,b<1,0.250,,,3,s,,\n"
    "T,delta,M,4096,snapkv,niah_multikey_3,b<1,0.5,,,1,s,,\n"                 # MK3: gated (1, 0), plain (0, 0)
    "T,p_open,M,4096,snapkv,,,0.75,,,2,s,,\n"
    "T,full,M,4096,snapkv,niah_multikey_3;vt,1.0,0.75,,,2,s,,\n"              # full (1, 1, 0, 1)
    "T,kept_kv_plain,M,4096,snapkv,,0.5,0.5,,,1,s,,\n"
    "T,compression,M,4096,snapkv,,0.5,1.6,,,1,s,,\n"                         # 1 / 0.625
    "T,batch_compression,M,4096,snapkv,,0.5,1.39,,,2,s,,2\n"                 # 1 / (1 - .75² + .75² · .5) = 1.3913
    "T,gated_min_over_budgets,M,4096,snapkv,,all,0.75,,,2,s,,\n"             # gated 0.75 at 0.5 and at 1.0
    "T,crossover_kept_kv,M,4096,snapkv,,b<1,0.625,,,3,s,,\n"                 # one gated point, above the frontier
    # 0.75 − (0.5 + 0.25 · 0.125 / 0.5) = 0.1875
    "T,max_matched_gain,pooled,4096,snapkv,,b<1,0.19,,,2,s,M@4096@snapkv,\n"
    "T,grand_mean_delta,pooled,4096,snapkv,vt,b<1,0.5,,,1,s,M@4096@snapkv;N@4096@snapkv,\n"  # (0 + 1) / 2
    "T,cells_rest_identical,pooled,4096,snapkv,vt,b<1,1,,,0,s,M@4096@snapkv;N@4096@snapkv,\n"  # M opens on all vt
    "T,harm_plain,pooled,,snapkv,vt,0.5,0.50,,,2,s,M@4096@snapkv;N@4096@snapkv,\n"  # N's two inputs of four
    "T,harm_gated,pooled,,snapkv,niah_multikey_3,0.5,0.5,,,1,s,M@4096@snapkv,\n"  # input 1 of inputs 0, 1
    "T,identical_evicting_rows,M,4096,h2o=snapkv,,b<1,3,,,0,s,,\n"
    "T,evicting_rows,M,4096,h2o=snapkv,,b<1,4,,,0,s,,\n"
    # the task-label oracle at b = 0.5: M closes on MK3 (full 1, 1) and opens on vt (plain 1, 1): Δ 1 − 0.5 = 0.5,
    # the gate's 0.25, gap −0.25; N opens on vt (plain 0, 0): Δ 0, the gate's 1, gap +1; neither decides alike
    "T,oracle_grand_mean_delta,pooled,4096,snapkv,,b<1,0.25,,,2,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,max_oracle_gap,pooled,4096,snapkv,,b<1,1.00,,,2,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,min_oracle_gap,pooled,4096,snapkv,,b<1,-0.25,,,2,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,cells_beat_oracle,pooled,4096,snapkv,,b<1,1,,,0,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,cells_lose_to_oracle,pooled,4096,snapkv,,b<1,1,,,0,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,cells_oracle_equal,pooled,4096,snapkv,,b<1,0,,,0,s,M@4096@snapkv;N@4096@snapkv,\n"
    "T,cells_oracle_equal,M,4096,snapkv,vt,b<1,1,,,0,s,M@4096@snapkv,\n"  # on vt alone both open every input
)


def test_columns_are_exactly_the_issues():
    t = _table(_paper(HAND))
    assert t.columns == ["item", "quantity", "model", "context_length", "evictor", "task", "budget", "paper_value",
                         "value", "difference", "status"]


def test_hand_worked_values_match():
    t = _table(_paper(HAND))
    bad = t.filter(pl.col("status") != "match")
    assert bad.height == 0, bad
    diff = t["value"] - t["paper_value"]
    assert (diff - t["difference"]).abs().max() < 1e-12


def test_printed_precision_decides_the_status():
    # gated 0.75: "0.74" is 0.01 off at 2 decimals (differs); "0.7" would be a tie, so 1/3 is used below
    paper = _paper("T,gated,M,4096,snapkv,niah_multikey_3;vt,b<1,0.74,,,2,s,,\n"
                   "T,gated,M,4096,snapkv,niah_multikey_3;vt,b<1,0.750,,,3,s,,\n")
    assert _table(paper)["status"].to_list() == ["differs", "match"]
    # a third: 0.333 matches at 3 decimals, 0.334 does not, 0.33 does at 2
    third = pl.DataFrame([_row("T3", "snapkv", "vt", i, 0.5, True, 1, int(i == 0)) for i in range(3)])
    paper = _paper("T,plain,T3,4096,snapkv,vt,b<1,0.333,,,3,s,,\nT,plain,T3,4096,snapkv,vt,b<1,0.334,,,3,s,,\n"
                   "T,plain,T3,4096,snapkv,vt,b<1,0.33,,,2,s,,\n")
    assert _table(paper, third)["status"].to_list() == ["match", "differs", "match"]


def test_interval_bounds_match_within_the_tolerance():
    # cell N: every input's paired difference is 1, so the cluster bootstrap's interval is [1, 1]
    paper = _paper("T,delta,N,4096,snapkv,vt,b<1,1.000,0.996,1.004,3,s,,\n"
                   "T,delta,N,4096,snapkv,vt,b<1,1.000,0.994,1.006,3,s,,\n")
    t = _table(paper)
    assert t["quantity"].to_list() == ["delta", "delta 95% CI low", "delta 95% CI high"] * 2
    assert t["status"].to_list() == ["match", "match", "match", "match", "differs", "differs"]
    assert t["value"].to_list()[1:3] == [1.0, 1.0]


def test_pooled_recovery_rate_and_its_wilson_interval():
    from statsmodels.stats.proportion import proportion_confint

    # vt pooled over M and N at b = 0.5: input 2 recovers (plain 1 > full 0); 3 (1 vs 1), 4, 5 (0 vs 1) do not
    low, high = proportion_confint(1, 4, alpha=0.05, method="wilson")
    cells = "M@4096@snapkv;N@4096@snapkv"
    paper = _paper(f"T,recovered_inputs,pooled,,snapkv,vt,b<1,1,,,0,s,{cells},\n"
                   f"T,inputs,pooled,,snapkv,vt,b<1,4,,,0,s,{cells},\n"
                   f"T,rho,pooled,,snapkv,vt,b<1,0.25,{low:.3f},{high:.3f},2,s,{cells},\n"
                   f"T,rho,pooled,,snapkv,vt,b<1,0.25,{low + 0.006:.3f},{high:.3f},2,s,{cells},\n")
    t = _table(paper)
    assert t["status"].to_list() == ["match"] * 6 + ["differs", "match"]


def test_table28_counts_and_smallest_bound_over_cells():
    # N's paired differences are all 1: its interval is [1, 1]; M's are 1, 0, 0, 0 (inputs 0-3 at b = 0.5), and a
    # resample of four inputs holds none of input 0 with probability (3/4)^4 = 0.32 > 2.5%: M's lower bound is 0
    cells = "M@4096@snapkv;N@4096@snapkv"
    paper = _paper(f"T,cells_ci_exclude_zero,pooled,4096,snapkv,,b<1,1,,,0,s,{cells},\n"
                   f"T,min_ci_low,pooled,4096,snapkv,,b<1,0.004,,,3,s,{cells},\n"      # a bound: within 0.005
                   f"T,min_ci_low,pooled,4096,snapkv,,b<1,0.006,,,3,s,{cells},\n"
                   f"T,min_ci_low,pooled,4096,snapkv,,b<1,1.000,,,3,s,N@4096@snapkv,\n")
    assert _table(paper)["status"].to_list() == ["match", "match", "differs", "match"]


def test_rows_the_logs_lack_are_kept_without_a_value():
    paper = _paper("T,delta,X,4096,snapkv,vt,b<1,0.1,,,1,s,,\n"           # no such model
                   "T,delta,M,4096,snapkv,fwe,b<1,0.1,,,1,s,,\n"           # no such task in M
                   "T,delta,M,4096,snapkv,vt;fwe,b<1,0.0,,,1,s,,\n"        # one of two tasks missing in M
                   "T,delta,M,4096,snapkv,vt,0.25,0.1,0.05,,1,s,,\n"      # no such budget in M (and its interval)
                   "T,delta,M,4096,pyramidkv,vt,b<1,0.1,,,1,s,,\n"        # no such evictor in M
                   "T,delta,M,16384,snapkv,vt,b<1,0.1,,,1,s,,\n"          # no such context
                   "T,grand_mean_delta,pooled,4096,snapkv,vt,b<1,0.5,,,1,s,M@4096@snapkv;X@4096@snapkv,\n"
                   "T,delta,M,4096,snapkv,vt,b<1,0.0,,,1,s,,\n")           # present: M's vt inputs, Δ 0
    t = _table(paper)
    assert t.height == 9  # eight rows and one interval bound, none dropped
    assert t["status"].to_list() == ["not-in-logs"] * 8 + ["match"]
    assert t["value"].null_count() == 8 and t["difference"].null_count() == 8


def test_a_planted_outcome_change_turns_rows_into_differs():
    paper = _paper(HAND)
    assert _table(paper)["status"].to_list().count("differs") == 0
    t = _table(paper, _hand_frame(flip=True))  # input 3's plain score at b = 0.5: 1 -> 0
    differs = t.filter(pl.col("status") == "differs")["quantity"].to_list()
    assert {"plain", "gated", "harm_plain", "max_matched_gain", "identical_evicting_rows"} <= set(differs)


def test_a_file_without_full_cache_rows_leaves_the_full_score_rows_out():
    # a gate-open input of a file without b = 1 rows has no known full-KV score (the release's Yi file)
    frame = _hand_frame().filter(pl.col("budget") < 1).with_columns(
        pl.when(pl.col("gate_open")).then(None).otherwise(pl.col("score_full")).alias("score_full"))
    paper = _paper("T,delta,M,4096,snapkv,niah_multikey_3;vt,b<1,0.250,,,3,s,,\n"
                   "T,harm_gated,pooled,,snapkv,niah_multikey_3,0.5,0.5,,,1,s,M@4096@snapkv,\n")
    assert _table(paper, frame)["status"].to_list() == ["match", "not-in-logs"]


def test_every_shipped_paper_row_has_a_recipe_and_a_source():
    paper = cf.paper_values()
    assert paper.height >= 90
    assert set(paper["quantity"]) <= set(cf.QUANTITIES)
    assert (paper["source"] != "").all() and (paper["decimals"] != "").all()
    for value, decimals in zip(paper["paper_value"], paper["decimals"]):
        # the printed precision is the number of digits typed after the point
        assert len(value.partition(".")[2]) == int(decimals), value


def test_the_report_of_logs_that_are_not_the_papers_says_so(tmp_path):
    logs = testing.synthetic_logs(models={"m6": (6, 3)}, evictors=("snapkv",), n_inputs=5, budgets=(0.125, 0.5, 1.0),
                                  with_topk=False, with_text=False)
    entry = conformance(Context(logs), tmp_path)
    written = pl.read_csv(tmp_path / entry["file"])
    assert written.columns == list(cf.COLUMNS)
    assert written.height >= cf.paper_values().height  # no paper row is dropped
    assert set(written["status"]) == {"not-in-logs"}
    assert entry["rows"] == [] and entry["counts"]["match"] == 0
    assert "not the paper's" in entry["sentence"]


@pytest.mark.parametrize("value", [math.nan])
def test_a_recipe_without_a_value_differs(value):
    # a crossover that never happens (NaN) is not a match
    row = {"item": "T", "model": "M", "context_length": "4096", "evictor": "snapkv", "task": "", "budget": "b<1",
           "decimals": "2"}
    assert cf._result(row, "crossover_kept_kv", "0.57", value, None)[-1] == "differs"


# --------------------------------------------------------------------------- the paper's own release

RELEASE = Path(__file__).resolve().parents[2] / "data" / "page-release" / "condensed"

#: Typed from the paper (Table 2; §4.1; Table 16; Table 28's caption): (model, evictor) → plain, gated, Δ.
TABLE2 = {
    ("Mistral-7B-Instruct-v0.3", "snapkv"): (0.623, 0.810, 0.187),
    ("Qwen2.5-1.5B-Instruct", "snapkv"): (0.438, 0.559, 0.121),
    ("Qwen2.5-3B-Instruct", "snapkv"): (0.580, 0.839, 0.259),  # the τ = 0.07 replay of a run at τ = 0.04
    ("Qwen2.5-14B-Instruct", "h2o"): (0.668, 0.868, 0.200),
    ("Qwen2.5-14B-Instruct", "pyramidkv"): (0.632, 0.860, 0.228),
}


@pytest.fixture(scope="module")
def release_logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("page-release")
    report = import_page([str(RELEASE)], out)
    return io.load(sorted(report.runs.values()))


@pytest.fixture(scope="module")
def release_gated(release_logs):
    return replay.gated_outcomes(release_logs, FixedTau(0.07))


def _n_rows() -> int:
    """Rows of the conformance table of the shipped paper values: one per value and per printed bound."""
    paper = cf.paper_values()
    return paper.height + int((paper["ci_low"] != "").sum()) + int((paper["ci_high"] != "").sum())


def _release_table(gated, paper=None):
    return cf.conformance_table(gated, rng=np.random.default_rng(defaults.BOOTSTRAP_SEED), paper=paper)


def _status(table, item, quantity, model, evictor="snapkv", **where):
    sel = table.filter((pl.col("item") == item) & (pl.col("quantity") == quantity) & (pl.col("model") == model)
                       & (pl.col("evictor") == evictor))
    for column, value in where.items():
        sel = sel.filter(pl.col(column) == value)
    assert sel.height == 1, (item, quantity, model, evictor, where)
    return sel.row(0, named=True)


def test_release_table2_cells_match_the_paper(release_gated):
    t = _release_table(release_gated)
    for (model, evictor), printed in TABLE2.items():
        for quantity, paper_value in zip(("plain", "gated", "delta"), printed):
            row = _status(t, "Table 2", quantity, model, evictor)
            assert row["paper_value"] == paper_value, (model, evictor, quantity)
            assert row["status"] == "match", row
    # Table 28's caption: the smallest lower bound is +0.093 (Qwen2.5-1.5B, SnapKV)
    ci = _status(t, "Table 2", "delta 95% CI low", "Qwen2.5-1.5B-Instruct")
    assert ci["paper_value"] == 0.093 and ci["status"] == "match", ci
    # Table 16: Yi-1.5-9B +39.0 pp on the four-budget grid, over the four tasks of the matrix
    yi = _status(t, "Table 16", "delta", "Yi-1.5-9B-Chat", task="niah_multikey_3;vt;fwe;qa_1")
    assert yi["paper_value"] == 0.390 and yi["status"] == "match", yi
    # the showcase (abstract, §4.1): NIAH-MK3 at b = 1/16, 0/100 plain, 89/100 gated, 99/100 full
    for quantity, budget, paper_value in (("plain", "0.0625", 0.00), ("gated", "0.0625", 0.89), ("full", "1.0", 0.99)):
        row = _status(t, "Mistral showcase", quantity, "Mistral-7B-Instruct-v0.3", budget=budget)
        assert row["paper_value"] == paper_value and row["status"] == "match", row


def test_release_rows_of_files_not_shipped_are_kept_as_not_in_logs(release_gated):
    t = _release_table(release_gated)
    assert t.height == _n_rows()  # every paper row, and every printed interval bound
    # Qwen2.5-14B SnapKV (+0.143), the 16-cell grand mean (+0.229) and Table 27's seven cells are not shipped
    assert _status(t, "Table 2", "delta", "Qwen2.5-14B-Instruct")["status"] == "not-in-logs"
    assert set(t.filter(pl.col("item").is_in(["Table 12", "Table 19", "Table 27"]))["status"]) == {"not-in-logs"}


def test_release_a_flipped_outcome_turns_table2_into_differs(release_gated):
    # one H2O evicting row of a gate-closed input planted wrong: plain moves by 1/600, so do plain and Δ
    key = release_gated.filter((pl.col("evictor") == "h2o") & (pl.col("budget") == 0.5) & ~pl.col("gate_open")
                               & (pl.col("score_plain") == 0.0)).row(0, named=True)
    hit = ((pl.col("evictor") == "h2o") & (pl.col("budget") == 0.5) & (pl.col("run_id") == key["run_id"])
           & (pl.col("task") == key["task"]) & (pl.col("input_id") == key["input_id"]))
    planted = release_gated.with_columns(pl.when(hit).then(1.0).otherwise(pl.col("score_plain")).alias("score_plain"))
    t = _release_table(planted)
    for quantity in ("plain", "delta"):
        assert _status(t, "Table 2", quantity, "Qwen2.5-14B-Instruct", "h2o")["status"] == "differs"
    assert _status(t, "Table 2", "gated", "Qwen2.5-14B-Instruct", "h2o")["status"] == "match"  # closed: full KV


def test_release_a_wrong_budget_set_or_threshold_differs(release_logs, release_gated):
    # Table 2's Δ averages over b < 1; with the full-cache rows averaged in, Mistral's Δ falls to 8/9 of it
    paper = cf.paper_values().with_columns(
        pl.when((pl.col("item") == "Table 2") & (pl.col("model") == "Mistral-7B-Instruct-v0.3"))
        .then(pl.lit("all")).otherwise(pl.col("budget")).alias("budget"))
    t = _release_table(release_gated, paper)
    assert _status(t, "Table 2", "delta", "Mistral-7B-Instruct-v0.3", budget="all")["status"] == "differs"
    # Qwen2.5-3B ran at τ = 0.04: its stored gate (0.815 gated) is not the paper's τ = 0.07 replay (0.839)
    t = _release_table(replay.gated_outcomes(release_logs, FixedTau(0.04)))
    assert _status(t, "Table 2", "gated", "Qwen2.5-3B-Instruct")["status"] == "differs"


def test_release_report_leads_with_the_conformance_section(release_logs, tmp_path):
    from pagestats.report import build_report

    index = Path(build_report(release_logs, tmp_path / "report", entries=()))
    text, page = index.read_text(), (index.parent / "index.html").read_text()
    assert text.index("## Conformance with the paper") < text.index("## Figures")
    assert page.index('id="conformance"') < page.index('id="figures"')
    written = pl.read_csv(index.parent / "tables" / "conformance.csv")
    assert written.columns == list(cf.COLUMNS) and written.height == _n_rows()
    # the rows these logs hold are shown on the page, a Table 2 cell among them
    assert "| Table 2 | delta | Mistral-7B-Instruct-v0.3 |" in text and "match at the printed precision" in text
    # and the items they lack are named with their cells
    assert "Table 19 (Qwen3-4B-Instruct-2507 dbtrimkv)" in text and "Table 2 (Qwen2.5-14B-Instruct snapkv)" in text


def test_the_projects_own_smollm2_logs_hold_no_paper_cell():
    # SmolLM2-135M at 512 tokens on the paper's tasks (NIAH-MK3, VT, FWE): none of its models and contexts
    data = Path(__file__).resolve().parents[2] / "data"
    logs = io.load([str(data / f"smollm2-512-{name}ruler-limits") for name in ("", "vt-", "fwe-")])
    t = _release_table(replay.gated_outcomes(logs, FixedTau(0.07)))
    assert t.height == _n_rows()
    assert set(t["status"]) == {"not-in-logs"} and t["value"].null_count() == t.height
