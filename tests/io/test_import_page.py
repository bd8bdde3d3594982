"""``pagestats import page``: the paper's released logs as runs (issue 40).

On the shipped condensed subset (data/page-release/condensed, attributed in its README) the imported
runs reproduce the paper's printed numbers, typed here from the paper with their table; on synthetic
files every quirk and bad-input rule of the release is exercised, each seen to fail on a planted breach.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from pagestats.cli import main
from pagestats.io import load, validate_paths
from pagestats.io.imports import ImportError_, import_page
from pagestats.io.imports.rules import infer_tau
from pagestats.replay import ProfileSpec
from pagestats.replay.policies import FixedTau
from pagestats.replay.whatif import whatif_summary, whatif_table

ROOT = Path(__file__).resolve().parents[2]
CONDENSED = ROOT / "data" / "page-release" / "condensed"
EXCERPT = ROOT / "data" / "page-release" / "excerpt"


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release")
    report = import_page([str(CONDENSED)], out, source_commit="df8ad09b9d5d6e2c0e70f2bceaf9fc5c55ec4845")
    assert report.skipped == []
    return out


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_the_shipped_subset_imports_into_five_valid_runs(imported):
    runs = sorted(p.name for p in imported.iterdir())
    assert runs == ["page-mistral-7b-instruct-v0.3-4k", "page-qwen2.5-1.5b-instruct-4k", "page-qwen2.5-14b-instruct-4k",
                    "page-qwen2.5-3b-instruct-4k", "page-yi-1.5-9b-chat-4k"]
    assert validate_paths([str(imported / r) for r in runs]) == []
    qwen14 = _manifest(imported / "page-qwen2.5-14b-instruct-4k")
    assert qwen14["evictors"] == ["h2o", "pyramidkv"]  # two files, one run: evictors on the same inputs
    assert qwen14["model"]["n_layers"] == 48 and qwen14["context_length"] == 4096
    assert qwen14["imported"]["source_commit"] == "df8ad09b9d5d6e2c0e70f2bceaf9fc5c55ec4845"


def test_the_stored_gates_threshold_is_inferred_and_recorded(imported):
    # release README: gated_4k_qwen3b.jsonl ran at τ = 0.04; the others at the paper's 0.07
    taus = {s["file"]: s["tau_run"] for r in imported.iterdir() for s in _manifest(r)["imported"]["sources"]
            if s["schema"] == "gated"}
    assert taus["gated_4k_qwen3b.jsonl"] == 0.04
    assert {t for f, t in taus.items() if f != "gated_4k_qwen3b.jsonl"} == {0.07}


def _summary(imported, run):
    logs = load([str(imported / run)])
    return {r["evictor"]: r for r in whatif_summary(whatif_table(logs, FixedTau(0.07)),
                                                    by=["model", "evictor"]).iter_rows(named=True)}


@pytest.mark.parametrize("run, evictor, plain, gated, delta", [
    # Table 2 (4K): plain / gated / Δ, mean over inputs and budgets b < 1, τ = 0.07
    ("page-mistral-7b-instruct-v0.3-4k", "snapkv", 0.623, 0.810, 0.187),
    ("page-qwen2.5-1.5b-instruct-4k", "snapkv", 0.438, 0.559, 0.121),
    ("page-qwen2.5-3b-instruct-4k", "snapkv", 0.580, 0.839, 0.259),  # the τ = 0.07 replay, not the stored 0.04 gate
    ("page-qwen2.5-14b-instruct-4k", "h2o", 0.668, 0.868, 0.200),
    ("page-qwen2.5-14b-instruct-4k", "pyramidkv", 0.632, 0.860, 0.228),
])
def test_table_2_cells_are_reproduced_from_the_release(imported, run, evictor, plain, gated, delta):
    row = _summary(imported, run)[evictor]
    assert round(row["acc_plain"], 3) == plain
    assert round(row["acc_gated"], 3) == gated
    assert round(row["delta"], 3) == delta


def test_yi_without_full_rows_gives_table_16_delta_and_no_invented_full_score(imported):
    row = _summary(imported, "page-yi-1.5-9b-chat-4k")["snapkv"]
    assert round(row["delta"], 3) == 0.323  # Table 16: all six tasks, Δ +0.323
    # 77 gate-open inputs have no full-KV outcome: what needs it is unknown, not a mean of the rest
    assert row["harm_plain"] is None and row["harm_gated"] is None
    assert _manifest(imported / "page-yi-1.5-9b-chat-4k")["imported"]["full_score_unknown"] == 77


def test_mistral_showcase_mk3_at_one_sixteenth(imported):
    # abstract / §1: NIAH-MK3 at b = 1/16 on Mistral-7B, plain 0/100, gated 89/100, full 99/100
    logs = load([str(imported / "page-mistral-7b-instruct-v0.3-4k")])
    cell = whatif_table(logs, FixedTau(0.07)).filter((pl.col("task") == "niah_multikey_3") & (pl.col("budget") == 0.0625))
    row = cell.row(0, named=True)
    assert (row["n_inputs"], round(row["acc_plain"] * 100), round(row["acc_gated"] * 100),
            round(row["acc_full"] * 100)) == (100, 0, 89, 99)


def test_a_threshold_needing_an_unknown_full_outcome_is_refused(imported, capsys):
    rc = main(["whatif", str(imported / "page-yi-1.5-9b-chat-4k"), "--tau", "0.08"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len([line for line in err if line.startswith("error")]) == 1
    assert "the gate closes on 28 inputs of page-yi-1.5-9b-chat-4k" in err[-1]


@pytest.mark.parametrize("option, words", [
    (["--k", "16"], "no per-pair Jaccards or top-k sets"),
    (["--pairs-fraction", "0.5"], "no per-pair Jaccards or top-k sets"),
    (["--layers", "first-half"], "no per-layer agreement profile"),
])
def test_replays_the_release_cannot_support_are_refused_in_one_line(imported, capsys, option, words):
    rc = main(["whatif", str(imported / "page-mistral-7b-instruct-v0.3-4k"), *option])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and words in err[-1] and err[-1].startswith("error:")


def test_layer_subset_replays_run_where_a_profile_was_matched(imported):
    manifest = _manifest(imported / "page-yi-1.5-9b-chat-4k")
    assert [s["schema"] for s in manifest["imported"]["sources"]] == ["gated", "profile"]
    logs = load([str(imported / "page-yi-1.5-9b-chat-4k")])
    assert logs.inputs["agreement"].null_count() == 0 and logs.inputs["agreement"].list.len().unique().to_list() == [48]
    table = whatif_table(logs, FixedTau(0.0), ProfileSpec(layers="first-half"))
    assert table.height == 24 and table["delta"].null_count() == 0


def test_importing_twice_gives_byte_identical_runs(imported, tmp_path):
    import_page([str(CONDENSED)], tmp_path, source_commit="df8ad09b9d5d6e2c0e70f2bceaf9fc5c55ec4845")
    for first in imported.rglob("*"):
        if first.is_file():
            assert (tmp_path / first.relative_to(imported)).read_bytes() == first.read_bytes(), first


def test_texts_are_kept_when_present(tmp_path, capsys):
    report = import_page([str(EXCERPT)], tmp_path)
    run = Path(report.runs["page-qwen2.5-14b-instruct-4k"])
    inputs = load([str(run)], columns="all").inputs
    assert inputs["references"].null_count() == 0 and _manifest(run)["imported"]["text"] is True
    assert main(["show", str(run), "--input", "page-qwen2.5-14b-instruct-4k/niah_multikey_3/0"]) == 0
    assert "1ee34dc4-3b04-4a8b-805b-fdc94e7ed827" in capsys.readouterr().out


# --------------------------------------------------------------------------- synthetic files


def _record(i, task, b, *, T=1000, drop=0.1, gate=True, plain=True, gated=True, **extra):
    return {"id": i, "task": task, "budget": b, "T": T, "drop": drop, "gate_open": gate,
            "n_kept_plain": int(b) if b > 1 else max(40, int(T * b)),
            "n_kept_gated": (int(b) if b > 1 else max(40, int(T * b))) if gate else T,
            "correct_plain": plain, "correct_gated": gated, **extra}


def _gated(budgets=(1.0, 0.5, 0.25), n=4, tau=0.07, **over):
    rows = []
    for i in range(n):
        task = "niah_multikey_3" if i < n // 2 else "vt"
        drop = 0.02 * i + 0.03
        for b in budgets:
            rows.append(_record(i, task, b, drop=drop, gate=drop >= tau, plain=b == 1.0 or i % 2 == 0, **over))
    return rows


def _write(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _import_error(paths, tmp_path) -> list[str]:
    with pytest.raises(ImportError_) as err:
        import_page([str(p) for p in paths], tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written
    return err.value.lines


def test_a_clean_synthetic_file_imports(tmp_path):
    src = _write(tmp_path / "gated_4k_qwen15b.jsonl", _gated())
    report = import_page([str(src)], tmp_path / "out")
    assert list(report.runs) == ["page-qwen2.5-1.5b-instruct-4k"] and report.skipped == []


def test_a_malformed_line_is_named(tmp_path):
    rows = _gated()
    rows[4] = '{"id": 1, "task": "niah_multikey_3", "budget": 0.5'
    lines = _import_error([_write(tmp_path / "gated_4k_qwen15b.jsonl", rows)], tmp_path)
    assert lines[0].startswith(f"{tmp_path / 'gated_4k_qwen15b.jsonl'}:5:")


def test_a_repeated_record_is_named(tmp_path):
    rows = _gated()
    rows.append(dict(rows[1]))
    lines = _import_error([_write(tmp_path / "gated_4k_qwen15b.jsonl", rows)], tmp_path)
    assert len(lines) == 1 and f":{len(rows)}:" in lines[0] and "repeats an earlier record" in lines[0]


@pytest.mark.parametrize("key, value, words", [("T", 999, "T 999 of input"), ("drop", 0.0301, "drop 0.0301 of input")])
def test_t_or_d_differing_across_an_inputs_rows_is_named(tmp_path, key, value, words):
    rows = _gated()
    rows[2][key] = value
    lines = _import_error([_write(tmp_path / "gated_4k_qwen15b.jsonl", rows)], tmp_path)
    assert len(lines) == 1 and ":3:" in lines[0] and words in lines[0]


def test_a_stored_gate_that_fits_no_single_tau_is_refused(tmp_path):
    rows = _gated()
    for r in rows:  # input 3 (D = 0.09) is closed while input 2 (D = 0.07) is open
        if r["id"] == 3:
            r["gate_open"] = False
    lines = _import_error([_write(tmp_path / "gated_4k_qwen15b.jsonl", rows)], tmp_path)
    assert len(lines) == 1 and "fits no single τ" in lines[0]


def test_infer_tau_prefers_the_papers_threshold_and_else_the_shortest_decimal():
    assert infer_tau(pl.Series([0.01, 0.05, 0.12]), pl.Series([False, False, True])).tau == 0.07
    assert infer_tau(pl.Series([0.0399, 0.04003]), pl.Series([False, True])).tau == 0.04
    assert infer_tau(pl.Series([0.08, 0.2]), pl.Series([False, True])).tau == 0.1
    assert infer_tau(pl.Series([0.08, 0.05]), pl.Series([False, True])) is None


def test_files_of_one_run_that_disagree_on_an_input_are_named(tmp_path):
    a = _write(tmp_path / "gated_h2o_qwen14b_4k.jsonl", _gated(score_policy="h2o"))
    rows = _gated(score_policy="pyramidkv")
    rows[0]["T"] = rows[1]["T"] = rows[2]["T"] = 1001
    b = _write(tmp_path / "gated_pyramidkv_qwen14b_4k.jsonl", rows)
    lines = _import_error([a, b], tmp_path)
    assert any("input (niah_multikey_3, 0) has T 1001" in line for line in lines)


def test_evictors_of_one_model_and_context_share_a_run(tmp_path):
    a = _write(tmp_path / "gated_h2o_qwen14b_4k.jsonl", _gated(score_policy="h2o"))
    b = _write(tmp_path / "gated_pyramidkv_qwen14b_4k.jsonl", _gated(score_policy="pyramidkv"))
    report = import_page([str(a), str(b)], tmp_path / "out")
    run = Path(report.runs["page-qwen2.5-14b-instruct-4k"])
    assert _manifest(run)["evictors"] == ["h2o", "pyramidkv"] and validate_paths([str(run)]) == []


def test_a_file_without_full_rows_leaves_open_inputs_full_score_unknown(tmp_path):
    rows = _gated(budgets=(0.5, 0.25))
    for r in rows:
        r["correct_gated"] = r["id"] != 1
    src = _write(tmp_path / "gated_4k_yi15_9b.jsonl", rows)
    run = Path(import_page([str(src)], tmp_path / "out").runs["page-yi-1.5-9b-chat-4k"])
    inputs = load([str(run)]).inputs.sort("input_id")
    # inputs 0, 1 (D 0.03, 0.05) were closed at τ = 0.07: their stored gated outcome is the full one
    assert inputs["full_score"].to_list() == [1.0, 0.0, None, None]


def test_absolute_budgets_become_nominal_fractions_of_the_context(tmp_path):
    src = _write(tmp_path / "gated_dbtrim_qwen15b_4k.jsonl", _gated(budgets=(128, 256, 512)))
    run = Path(import_page([str(src)], tmp_path / "out").runs["page-qwen2.5-1.5b-instruct-4k"])
    assert sorted(_manifest(run)["budgets"]) == [128 / 4096, 256 / 4096, 512 / 4096]


def test_a_profile_is_matched_only_when_its_d_equals_the_logged_drop(tmp_path):
    gated = _write(tmp_path / "gated_4k_yi15_9b.jsonl", _gated())
    profiles = []
    for i in range(4):  # 48 layers: 16 early at a, 16 late at a - D, so D = a - (a - D)
        drop = 0.02 * i + 0.03
        profiles.append({"task": "niah_multikey_3" if i < 2 else "vt", "T": 1000,
                         "head_agreement_per_layer": [0.5] * 16 + [0.45] * 16 + [0.5 - drop] * 16})
    good = _write(tmp_path / "a" / "drops_yi15_9b_4k.jsonl", profiles)
    report = import_page([str(gated), str(good)], tmp_path / "out")
    assert report.skipped == []
    profiles[3]["head_agreement_per_layer"][-1] += 1e-6 * 16  # D moves by 1e-6: refused
    bad = _write(tmp_path / "b" / "drops_yi15_9b_4k.jsonl", profiles)
    report = import_page([str(gated), str(bad)], tmp_path / "out2")
    assert len(report.skipped) == 1 and "D from the profile" in report.skipped[0]


def test_other_schemas_stubs_and_invalid_folders_are_skipped_with_one_line_each(tmp_path):
    _write(tmp_path / "rel" / "gated_4k_qwen15b.jsonl", _gated())
    _write(tmp_path / "rel" / "dynamickv_qwen3_4k.jsonl", [{"id": 0, "task": "vt", "budget": 0.5, "T": 900,
                                                            "layer_budgets": [1, 2], "acc": 1.0}])
    (tmp_path / "rel" / "gated_16k_smoke.jsonl").write_text("")
    _write(tmp_path / "rel" / "INVALID_prefill_bug" / "gated_4k_qwen3b.jsonl", _gated())
    (tmp_path / "rel" / "notes.md").write_text("# notes\n")
    report = import_page([str(tmp_path / "rel")], tmp_path / "out")
    assert list(report.runs) == ["page-qwen2.5-1.5b-instruct-4k"]
    text = "\n".join(report.skipped)
    assert "dynamickv_qwen3_4k.jsonl: skipped: its records (keys ['T', 'acc', 'budget', 'id', 'layer_budgets', " \
        "'task']) match no schema this importer reads" in text
    assert "gated_16k_smoke.jsonl: skipped: it holds no records" in text
    assert "INVALID_prefill_bug/gated_4k_qwen3b.jsonl: skipped: the authors marked its folder invalid" in text
    assert "1 files in the folders given are not .jsonl" in text


def test_overrides_and_unknown_names(tmp_path, capsys):
    src = _write(tmp_path / "results.jsonl", _gated())
    report = import_page([str(src)], tmp_path / "out")
    assert report.runs == {} and "its name gives no model and context length" in report.skipped[0]
    report = import_page([str(src)], tmp_path / "out", model="mistral7b", context=16384, evictor="h2o")
    run = Path(report.runs["page-mistral-7b-instruct-v0.3-16k"])
    assert _manifest(run)["evictors"] == ["h2o"]
    assert main(["import", "page", str(src), "--out", str(tmp_path / "o3"), "--model", "gpt-9"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_bad_records_exit_1_and_write_nothing(tmp_path, capsys):
    rows = _gated()
    rows[0] = "[1, 2]"
    src = _write(tmp_path / "gated_4k_qwen15b.jsonl", rows)
    assert main(["import", "page", str(src), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert ":1: a JSON list, not an object" in err and not any((tmp_path / "out").glob("page-*"))
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def _adakv(n=4, budgets=(0.5, 0.25), tau=0.07):
    rows = []
    for i in range(n):
        drop = 0.02 * i + 0.03
        for b in budgets:
            rows.append({"id": i, "task": "niah_multikey_3" if i < n // 2 else "vt", "budget": b, "T": 1000,
                         "drop": drop, "gate_open": drop >= tau, "correct_full": i != 3,
                         "correct_plain_shared": i % 2 == 0, "n_kept_shared": b * 1000 + 0.4,
                         "correct_gated_shared": True, "correct_plain_adakv": True, "n_kept_adakv": b * 1000 - 0.4,
                         "correct_gated_adakv": True, "pred_full": "x"})
    return rows


def test_ada_kv_files_become_a_run_of_their_own_with_two_arms(tmp_path):
    _write(tmp_path / "rel" / "gated_4k_qwen15b.jsonl", _gated())
    _write(tmp_path / "rel" / "adakv_4k_qwen15b.jsonl", _adakv())
    capbound = _adakv()
    for r in capbound:  # other tasks, same arms: the same run
        r["task"] = {"niah_multikey_3": "cwe", "vt": "qa_2"}[r["task"]]
    _write(tmp_path / "rel" / "capbound_4k_qwen15b.jsonl", capbound)
    report = import_page([str(tmp_path / "rel")], tmp_path / "out")
    assert sorted(report.runs) == ["page-qwen2.5-1.5b-instruct-4k", "page-qwen2.5-1.5b-instruct-4k-adakv"]
    run = Path(report.runs["page-qwen2.5-1.5b-instruct-4k-adakv"])
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    assert sorted(logs.outcomes["evictor"].unique().to_list()) == ["adakv-snapkv", "snapkv"]
    assert logs.inputs.height == 8 and logs.inputs["full_score"].null_count() == 0  # correct_full on every row
    assert sorted(logs.outcomes.filter(pl.col("evictor") == "snapkv")["n_kept"].unique().to_list()) == [250, 500]


def test_a_recorded_tau_the_stored_gate_contradicts_is_named(tmp_path):
    rows = _gated(tau=0.07)
    for r in rows:
        r["tau"] = 0.07
    rows[7]["gate_open"] = not rows[7]["gate_open"]
    for r in rows:  # keep the input's rows consistent, so only the tau rule fires
        if r["id"] == rows[7]["id"]:
            r["gate_open"] = rows[7]["gate_open"]
    lines = _import_error([_write(tmp_path / "gated_dbtrimkv_qwen3_4k.jsonl", rows)], tmp_path)
    assert any("contradicts drop" in line and "tau 0.07" in line for line in lines)


def test_dbtrimkv_n_kept_summed_over_layers_and_kv_heads_is_per_position(tmp_path):
    rows = _gated(budgets=(128, 256))
    for r in rows:
        r["n_kept_plain"] = int(r["budget"]) * 36 * 8  # Qwen3-4B: 36 layers × 8 KV heads
    run = Path(import_page([str(_write(tmp_path / "gated_dbtrimkv_qwen3_4k.jsonl", rows))], tmp_path / "out")
               .runs["page-qwen3-4b-instruct-2507-4k"])
    logs = load([str(run)])
    assert sorted(logs.outcomes["n_kept"].unique().to_list()) == [128, 256]
    assert logs.outcomes["evictor"].unique().to_list() == ["dbtrimkv"]
    rows[0]["n_kept_plain"] += 1  # not a whole multiple of 288
    assert "layer × KV-head slots" in _import_error([_write(tmp_path / "b" / "gated_dbtrimkv_qwen3_4k.jsonl", rows)],
                                                    tmp_path / "b")[0]


def test_a_partial_file_is_skipped_with_one_line(tmp_path):
    rows = [r for r in _gated() if not (r["id"] == 3 and r["budget"] == 0.25)]
    report = import_page([str(_write(tmp_path / "gated_4k_qwen15b.jsonl", rows))], tmp_path / "out")
    assert report.runs == {} and "a partial file: 1 of 4 inputs lack some of its 3 budgets" in report.skipped[0]


def test_evictor_files_with_different_budget_grids_share_a_run(tmp_path):
    # the release's Qwen2.5-14B: SnapKV at 9 budgets, H2O at 4, on the same inputs
    a = _write(tmp_path / "gated_4k_qwen14b.jsonl", _gated(budgets=(1.0, 0.5, 0.25, 0.125)))
    b = _write(tmp_path / "gated_h2o_qwen14b_4k.jsonl", _gated(budgets=(1.0, 0.5), score_policy="h2o"))
    extra = _gated(budgets=(1.0, 0.5, 0.25, 0.125))
    for r in extra:
        r["task"] = "qa_2"
    c = _write(tmp_path / "gated_4k_qwen14b_extra.jsonl", extra)
    report = import_page([str(a), str(b), str(c)], tmp_path / "out")
    assert sorted(report.runs) == ["page-qwen2.5-14b-instruct-4k", "page-qwen2.5-14b-instruct-4k-extra"]
    run = Path(report.runs["page-qwen2.5-14b-instruct-4k"])
    assert len(_manifest(run)["imported"]["arms"]) == 6 and validate_paths([str(run)]) == []


def test_longbench_answers_are_the_references(tmp_path):
    rows = _gated()
    for r in rows:
        r["task"], r["answers"] = "qasper", ["an answer", "another"]
    run = Path(import_page([str(_write(tmp_path / "longbench_mistral7b.jsonl", rows))], tmp_path / "out",
                           context=16384).runs["page-mistral-7b-instruct-v0.3-16k"])
    assert load([str(run)], columns="all").inputs["references"].to_list()[0] == ["an answer", "another"]


def _sweep(n=3, budgets=(1.0, 0.5, 0.25)):
    return [{"id": i, "task": "vt", "budget": b, "T": 1000, "n_kept": int(1000 * b), "gold": ["x"], "pred": "x",
             "correct": b == 1.0 or i == 0} for i in range(n) for b in budgets]


def test_a_ruler_sweep_is_a_run_without_d_that_no_gate_replay_reads(tmp_path, capsys):
    src = _write(tmp_path / "ruler_4k_qwen3b.jsonl", _sweep())
    run = Path(import_page([str(src)], tmp_path / "out").runs["page-qwen2.5-3b-instruct-4k-ruler"])
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    assert logs.inputs["drop"].null_count() == 3 and logs.inputs["full_score"].to_list() == [1.0, 1.0, 1.0]
    assert main(["whatif", str(run)]) == 2
    assert "they have no D (a RULER sweep" in capsys.readouterr().err
    from pagestats import metrics, replay
    rho = metrics.recovery_rate(metrics.relation(replay.plain_outcomes(logs)), arm="plain")
    assert rho["k"].to_list() == [0] and rho["n"].to_list() == [3]  # full is right on every input: none recovers


def test_a_sweep_input_without_its_full_cache_row_is_named(tmp_path):
    rows = [r for r in _sweep() if not (r["id"] == 2 and r["budget"] == 1.0)]
    lines = _import_error([_write(tmp_path / "ruler_4k_qwen3b.jsonl", rows)], tmp_path)
    assert lines == [f"{tmp_path / 'ruler_4k_qwen3b.jsonl'}:7: input (vt, 2) has no b = 1 (full-cache) row"]


def test_line_numbers_count_blank_lines(tmp_path):
    rows = _gated()
    rows.insert(3, "")
    rows.append(dict(rows[1]))
    lines = _import_error([_write(tmp_path / "gated_4k_qwen15b.jsonl", rows)], tmp_path)
    assert len(lines) == 1 and f":{len(rows)}:" in lines[0]


def test_nested_files_repeating_rows_identically_keep_them_once(tmp_path):
    # the release's gated_4k_llama31_8b_seed1_n20 / _n30 / _n100: the smaller runs are prefixes of the larger
    small = _write(tmp_path / "gated_4k_llama31_8b_seed1_n2.jsonl", [r for r in _gated() if r["id"] in (0, 2)])
    large = _write(tmp_path / "gated_4k_llama31_8b_seed1_n4.jsonl", _gated())
    report = import_page([str(small), str(large)], tmp_path / "out")
    run = Path(report.runs["page-llama-3.1-8b-instruct-4k-seed1"])
    assert load([str(run)]).outcomes.height == 12 and any("6 rows repeat an earlier file's identically" in s
                                                           for s in report.skipped)
    rows = _gated()
    rows[0]["correct_plain"] = not rows[0]["correct_plain"]
    rows[0]["budget"] = 1.0
    other = _write(tmp_path / "b" / "gated_4k_llama31_8b_seed1_n4.jsonl", rows)
    lines = _import_error([small, other], tmp_path / "b")
    assert any("with another" in line or "full-KV outcome" in line for line in lines)
