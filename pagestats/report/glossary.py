"""Human column headers and a one-line meaning for every column of the report's tables.

The tables keep their tidy column names (CSV files, scripts); the HTML page and ``index.md``
show :func:`header` instead, with a glossary of the columns a table has under it
(:func:`glossary`). A few names mean different things in different tables; :data:`BY_TABLE`
overrides them there (Table 1's ``k`` is the number of recovered inputs, not a top-k size).

A derived column also has a formula over the other columns of its row (:data:`FORMULAS`,
:data:`FORMULAS_BY_TABLE`), written in SQL that :func:`polars.sql_expr` evaluates. The glossary
prints it after the meaning, and the test suite evaluates it on every row of the report's own
CSV files and compares it with the column, so a glossary cannot describe another formula.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from pagestats.core import formulas
from pagestats.core.defaults import HEADLINE_BATCH as _B  # the headline's batch size (Table 23)

#: tidy name → (header, meaning).
COLUMNS: dict[str, tuple[str, str]] = {
    "model": ("model", "model name from the run manifest"),
    "context_length": ("context", "target prompt length in tokens"),
    "evictor": ("evictor", "base KV-cache evictor"),
    "task": ("task", "RULER task"),
    "task_class": ("task class", "capacity-bound or dilution-prone (from the manifest)"),
    "budget": ("budget b", "nominal KV budget: fraction of the prompt's positions kept"),
    "scope": ("scope", "cell: one (model, context, task); pooled: all cells together, of the capacity-bound anchor "
              "(NIAH-MK3, named in task) or of the dilution-prone tasks"),
    "n": ("n inputs", "inputs counted"),
    "n_inputs": ("n inputs", "inputs counted"),
    "k": ("n recovered", "inputs with the event counted by the rate"),
    "rho": ("ρ", "recovery rate: share of inputs whose best plain budget beats the full cache (Eq. 1)"),
    "low": ("95% low", "lower end of the 95% interval of the estimate to its left"),
    "high": ("95% high", "upper end of the 95% interval of the estimate to its left"),
    "dilution_prone": ("dilution-prone", "ρ ≥ 0.05 (Eq. 1)"),
    "under_powered": ("under-powered", "the 95% interval straddles the claim's threshold (ρ: 0.05; Δ: 0), so the "
                      "claim is not settled either way: more inputs needed (`pagestats power claims` says how many)"),
    "delta": ("Δ", "gated − plain accuracy, mean over inputs and budgets b < 1"),
    "delta_rest": ("Δ without the anchor", "Δ over the inputs of every task but the capacity-bound anchor NIAH-MK3 "
                   "(the paper's \"excluding NIAH-MK3\"; niah_multiquery stays in)"),
    "p_open_rest": ("p_open without the anchor", "gate-open share on the inputs of every task but NIAH-MK3"),
    "identical": ("gated ≡ plain", "the gate opens on every input outside the anchor NIAH-MK3, so gated "
                  "equals plain there (the paper's †)"),
    "same_as": ("same outcomes as", "the other evictors of the (model, context) whose plain outcomes (score, kept "
                "tokens) equal this one's on every evicting row, b < 1 (so do their gated ones): their cells agree by "
                "construction, not as a finding"),
    "decode_limited": ("decode-limited", "tasks of the row's inputs whose full-KV answers the decode limit may have "
                       "cut (e.g. a draw collected with the first 32-token limit)"),
    "p_open": ("p_open", "share of inputs on which the gate opens (D ≥ τ)"),
    "mean_drop": ("mean D", "mean head-agreement drop D (Eq. 3)"),
    "sd_drop": ("SD of D", "standard deviation of D over the inputs"),
    "tau": ("τ", "threshold of the gate"),
    "rank": ("rank of mean D", "1 = the smallest mean D of the cell"),
    "smallest": ("smallest mean D", "this task has the smallest mean D of its cell"),
    "distractors": ("distractors", "distractor keys of the NIAH-MultiKey variant"),
    "monotone": ("monotone", "mean D decreases strictly along MultiKey 1 → 2 → 3"),
    "ratio_first_last": ("D ratio first/last", "mean D of MultiKey-1 over mean D of MultiKey-3"),
    "statistic": ("signal", "gate signal or profile statistic"),
    "separated": ("separated", "the anchor's (NIAH-MK3) task mean and the dilution-prone task means lie on either "
                  "side of one threshold"),
    "below": ("anchor below", "the anchor's (NIAH-MK3) task mean lies below every dilution-prone task mean"),
    "margin": ("margin", "smallest dilution-prone task mean minus the anchor's (NIAH-MK3) task mean"),
    "margin_minus": ("margin without excluded tasks", "the margin with the listed tasks left out"),
    "auc": ("AUC", "separability of the anchor's (NIAH-MK3) inputs from the dilution-prone tasks' inputs "
            "(Mann–Whitney)"),
    "auc_oriented": ("AUC (either side)", "max(AUC, 1 − AUC)"),
    "n_capacity": ("n NIAH-MK3", "inputs of the capacity-bound anchor NIAH-MK3"),
    "n_dilution": ("n dilution-prone", "inputs of the dilution-prone tasks"),
    "p_value": ("p", "p-value"),
    "p_adjusted": ("p (BH)", "p-value after Benjamini–Hochberg across the table's rows"),
    "rejected": ("significant (BH)", "rejected at q = 0.05 after Benjamini–Hochberg"),
    "mk_monotone": ("MK monotone", "the signal's task means are strictly monotone, increasing or decreasing, along "
                    "MultiKey 1 → 2 → 3 (Table 5's \"MK mono.\")"),
    "pearson_r": ("r with D", "Pearson correlation with D over inputs"),
    "mean_drop_capacity": ("mean D capacity-bound", "mean D over the capacity-bound calibration inputs"),
    "mean_drop_dilution": ("mean D dilution-prone", "mean D over the dilution-prone calibration inputs"),
    "tau_calibrated": ("τ calibrated", "midpoint threshold (Eq. 5)"),
    "tau_fixed": ("τ fixed", "the fixed threshold"),
    "delta_fixed": ("Δ at fixed τ", "Δ with the fixed threshold"),
    "delta_calibrated": ("Δ at calibrated τ", "Δ with the calibrated threshold"),
    "p_open_fixed": ("p_open at fixed τ", "gate-open share with the fixed threshold"),
    "p_open_calibrated": ("p_open at calibrated τ", "gate-open share with the calibrated threshold"),
    "winner": ("better", "the threshold with the larger Δ"),
    "pairs_fraction": ("head-pair fraction", "fraction of head pairs kept per draw"),
    "n_pairs": ("n pairs", "head pairs per layer"),
    "n_pairs_kept": ("n pairs kept", "head pairs kept per draw"),
    "n_draws": ("n draws", "random draws"),
    "margin_mean": ("mean margin", "margin averaged over the draws"),
    "margin_min": ("min margin", "smallest margin over the draws"),
    "margin_max": ("max margin", "largest margin over the draws"),
    "n_ordered": ("n ordered", "draws whose margin is positive"),
    "layers": ("layers", "layer subset D is computed on"),
    "n_layers": ("n layers", "layers in the subset"),
    "ordered": ("ordered", "the margin is positive"),
    "capacity_max": ("NIAH-MK3 mean D", "task mean of D of the capacity-bound anchor NIAH-MK3"),
    "dilution_min": ("min dilution-prone mean D", "smallest dilution-prone task mean of D"),
    "note": ("note", "why a value is missing: a layer subset that cannot be computed, a bootstrap cell with "
             "one input or no variation (p is NaN and the cell is left out of the BH family), or a cell without "
             "the midpoint recipe's 20 inputs of each class (Eq. 5), or a prediction band of zero width (Table 21: "
             "fitted on one context)"),
    "acc_full": ("accuracy full KV", "mean score with the full cache"),
    "acc_plain": ("accuracy plain", "mean score of plain eviction"),
    "acc_gated": ("accuracy gated", "mean score of the gated arm (Eq. 2)"),
    "kept_kv_gated": ("kept KV gated", "mean n_kept / n_tokens of the gated arm"),
    "kept_kv_plain": ("kept KV plain", "mean n_kept / n_tokens of plain eviction"),
    "kept_kv_open": ("kept KV when open", "mean kept fraction over the gate-open inputs"),
    "kept_kv": ("kept KV", "mean n_kept / n_tokens"),
    "kv_gib": ("KV GiB per sequence", "kept KV × the full cache of one sequence in GiB (from the manifest)"),
    "compression": ("compression", "1 / kept KV"),
    "delta_policy": ("Δ gate", "Δ of the gate's policy"),
    "delta_oracle": ("Δ oracle", "Δ of the task-label oracle that closes on NIAH-MK3 and opens elsewhere (Table 14)"),
    "gap": ("gap", "Δ gate − Δ oracle"),
    "same_decisions": ("same decisions", "the gate and the oracle decide alike on every input"),
    "best_plain": ("best plain evictor", "evictor with the highest plain accuracy"),
    "acc_best_plain": ("its accuracy", "plain accuracy of the best plain evictor"),
    "best_gated": ("best gated evictor", "evictor with the highest gated accuracy"),
    "acc_best_gated": ("its gated accuracy", "gated accuracy of the best gated evictor"),
    "gain": ("gain", "best gated − best plain accuracy"),
    "n_evictors": ("n evictors", "evictors compared"),
    "n_fit_rows": ("n fit rows", "rows the ratio band is fitted on"),
    "ratio_low": ("ratio low", "lower end of the fitted ρ / headroom band"),
    "ratio_high": ("ratio high", "upper end of the fitted ρ / headroom band"),
    "headroom": ("headroom", "1 − A_full"),
    "predicted_low": ("predicted ρ low", "ratio low × headroom"),
    "predicted_high": ("predicted ρ high", "ratio high × headroom"),
    "inside": ("inside band", "the measured ρ lies in the predicted band"),
    "sha256": ("sha256", "hash of the frozen prediction file (Table 21)"),
    "batch_size": ("batch size", "sequences in a static batch"),
    "kept_open": ("kept KV when open", "kept fraction of an open input"),
    "p_all_open": ("P(all open)", "p_open^B: every input of the batch opens"),
    "provisioned": ("provisioned", "cache provisioned per sequence: (1 − p^B) + p^B · kept"),
    "a_full": ("A_full", "full-KV accuracy"),
    "ratio": ("ρ / headroom", "ρ / (1 − A_full)"),
    "slope": ("slope", "through-origin slope of ρ on headroom (Eq. 4)"),
    "slope_se": ("slope SE", "standard error of the slope"),
    "fit_n": ("fit rows", "rows of the fit"),
    "fitted_rho": ("fitted ρ", "slope × headroom"),
    "in_fit": ("in fit", "the row is used by the fit (dilution-prone)"),
    **{f"{col}_{rule}": (f"{head} ({label})", f"{meaning}; rows chosen by {label}")
       for rule, label in (("task_class", "task class"), ("rho", "ρ ≥ 0.05"))
       for col, head, meaning in (
           ("slope", "slope", "binomial GLM slope of ρ on headroom through the origin (Eq. 4)"),
           ("slope_se", "slope SE", "model standard error of the slope"),
           ("slope_ls", "slope, least squares", "the paper's estimator: unweighted least squares of ρ on headroom "
                        "through the origin, on the same rows"),
           ("fit_n", "fit rows", "rows of the fit (headroom > 0)"),
           ("zero_headroom", "zero-headroom rows", "rows left out of the fit because A_full = 1"),
           ("in_fit", "in fit", "the row is used by the fit"))},
    "n_left_out": ("n left out", "inputs of the cell left out so that the compared cells hold the same inputs"),
    "tau_gate": ("τ of the gate", "the fixed τ carried to this statistic (recalibrated, App. A.3.1), or the fixed τ"),
    "degenerate": ("degenerate", "the gate opens on none or on all of the cell's inputs: Δ would measure the threshold"),
    "recalibration": ("recalibration", "how τ was carried to the changed statistic, or why it was not computed"),
    "status": ("status", "pre-registered (frozen band, checked) or a post-hoc illustration"),
    "n_evaluated": ("n evaluated", "inputs evaluated (a held-out pilot's inputs are not)"),
    "harm_gated": ("harm gated", "share of inputs the gated arm scores below the full cache"),
    "gated_low": ("gated 95% low", "lower end of the gated harm interval"),
    "gated_high": ("gated 95% high", "upper end of the gated harm interval"),
    "harm_plain": ("harm plain", "share of inputs plain eviction scores below the full cache"),
    "plain_low": ("plain 95% low", "lower end of the plain harm interval"),
    "plain_high": ("plain 95% high", "upper end of the plain harm interval"),
    "policy": ("policy", "the pagestats.replay policy class"),
    "name": ("name", "the policy with its default parameters"),
    "rule": ("rule", "how the policy decides (its docstring's first paragraph)"),
    "labels": ("labels needed", "what the policy needs besides D"),
    "used_in": ("used in", "where the report and the CLI apply it"),
    "rho_single": ("ρ single mask", "ρ (Eq. 1) of single-mask SnapKV"),
    "single_low": ("single 95% low", "lower end of its Wilson interval"),
    "single_high": ("single 95% high", "upper end of its Wilson interval"),
    "rho_per_layer": ("ρ per layer", "ρ (Eq. 1) of per-layer SnapKV"),
    "per_layer_low": ("per-layer 95% low", "lower end of its Wilson interval"),
    "per_layer_high": ("per-layer 95% high", "upper end of its Wilson interval"),
    "row": ("row", "what the row estimates (Table 29)"),
    "estimate": ("estimate", "Δ (gated − plain, mean over inputs and b < 1) or, on showcase rows, an arm's accuracy"),
    "interval": ("interval", "how the 95% interval is computed: cluster bootstrap over inputs, or Wilson"),
    "acc_snapkv": ("accuracy SnapKV", "plain SnapKV accuracy, mean over b < 1"),
    "acc_random": ("accuracy random", "plain accuracy of uniform-random scoring, mean over b < 1"),
    "rho_snapkv": ("ρ SnapKV", "ρ (Eq. 1) of plain SnapKV"),
    "snapkv_low": ("SnapKV 95% low", "lower end of its Wilson interval"),
    "snapkv_high": ("SnapKV 95% high", "upper end of its Wilson interval"),
    "rho_random": ("ρ random", "ρ (Eq. 1) of uniform-random scoring"),
    "random_low": ("random 95% low", "lower end of its Wilson interval"),
    "random_high": ("random 95% high", "upper end of its Wilson interval"),
    "rho_ratio": ("ρ ratio ×", "ρ per layer / ρ single mask (null when the single mask's ρ is 0)"),
    "delta_matched": ("Δ at matched memory", "gated accuracy − plain eviction's frontier accuracy at the same mean "
                      "kept KV, mean over b < 1"),
    "acc_plain_matched": ("plain at matched KV", "plain eviction's frontier accuracy at the gated arm's mean kept KV, "
                          "mean over b < 1"),
    "delta_nominal": ("Δ at nominal budget", "gated − plain accuracy at the same budget b, mean over b < 1"),
    "matched_low": ("matched 95% low", "lower end of the matched-memory Δ interval"),
    "matched_high": ("matched 95% high", "upper end of the matched-memory Δ interval"),
    "matched_p": ("matched p (BH)", "BH-adjusted p of the matched-memory Δ"),
    "harm_ratio": ("harm ratio ×", "harm plain / harm gated (null when harm gated is 0)"),
    "n_budgets": ("n budgets", "budgets b < 1 per input"),
    "n_boot": ("bootstrap replicates", "cluster-bootstrap replicates"),
    "excludes_zero": ("excludes 0", "the 95% interval excludes 0"),
    "subset": ("subset", "the tasks Δ is over: all tasks, or the capacity-bound anchor NIAH-MK3 alone (the paper's "
               "lower block)"),
    "draw": ("draw", "seed of the input draw"),
    "mean": ("mean Δ", "mean Δ over the draws"),
    "sd": ("SD of Δ", "standard deviation of Δ over the draws"),
    "range": ("range of Δ", "largest − smallest Δ over the draws"),
    "pilot_split": ("pilot split", "how the pilot is drawn: first, random or held-out inputs"),
    "pilot_by": ("pilot per", "pilot pooled per model or per model × context"),
    "pilot_n": ("pilot size", "inputs in the pilot"),
    "closed_call": ("closed call", "fewer than half of the task's inputs open"),
    "flips": ("flips", "the closed call differs from the reference definition"),
    "n_flipping_definitions": ("n flipping definitions", "pilot definitions whose call differs"),
    "delta_task": ("Δ task", "Δ over the task's inputs"),
    "delta_cell": ("Δ cell", "Δ over the cell's inputs"),
    "tau_from": ("τ from", "smallest threshold giving this point"),
    "tau_to": ("τ to", "largest threshold giving this point"),
    "accuracy": ("accuracy", "mean score of the gated arm at this (τ, b)"),
    "harm_reduction": ("harm cut, pp", "harm plain − harm gated, in percentage points"),
    "harm_plain_all": ("harm plain, all", "share of (input, budget b < 1) of every task plain eviction scores below the "
                       "full cache"),
    "harm_gated_all": ("harm gated, all", "the same share for the gated arm"),
    "kept_kv_budget": ("kept KV at b = 1/16", "mean n_kept / n_tokens of the gated arm at b = 1/16"),
    "compression_batch": ("compression, batch 8", "1 / provisioned at batch 8 (Table 23)"),
}

#: table name → {tidy name: (header, meaning)} where a name means something else there.
BY_TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "tab01_recovery": {"k": ("n recovered", "inputs whose best plain budget b < 1 beats the full cache")},
    "tabA31_k_sweep": {"k": ("top-k", "size of the top-k key sets the agreement a_ℓ and D are computed from")},
    "tab25_scaling": {"k": ("n recovered", "inputs whose best plain budget b < 1 beats the full cache")},
    "tab03_drop_by_task": {"tau": ("τ", "the policy's threshold for the cell's inputs")},
    "tab24_drop_by_task_strict": {"tau": ("τ", "the policy's threshold for the cell's inputs")},
    "tab21_preregistered": {"n": ("n inputs", "inputs of the measured row")},
    "tab12_delta_by_task": {"identical": ("gated ≡ plain (cell)", "the cell's † of Table 2: the gate opens on every "
                                          "input of the cell outside the anchor NIAH-MK3")},
    "tab13_budget_axis": {"delta": ("Δ at b", "gated − plain accuracy at this row's budget b, mean over inputs"),
                          "same_as": ("same outcomes as", "the other evictors of the (model, context) whose plain "
                                      "outcomes (score, kept tokens) equal this one's on every input at this budget")},
    "tab10_layers": {"margin": ("margin", "smallest mean D among the other tasks minus the anchor's (NIAH-MK3) "
                                "(Table 10)"),
                     "dilution_min": ("min other-task mean D", "smallest task mean of D among the tasks but NIAH-MK3")},
}


#: tidy name → its formula over the other columns of the same row (SQL, see the module docstring).
FORMULAS: dict[str, str] = {
    "rho": "CAST(k AS DOUBLE) / n",
    "dilution_prone": "rho >= 0.05",
    "headroom": "1 - a_full",
    "ratio": "rho / NULLIF(headroom, 0)",
    "predicted_low": "ratio_low * headroom",
    "predicted_high": "ratio_high * headroom",
    "inside": "rho >= predicted_low AND rho <= predicted_high",
    "fitted_rho": "slope_task_class * headroom",
    "gap": "delta_policy - delta_oracle",
    "gain": "acc_best_gated - acc_best_plain",
    "delta_matched": "acc_gated - acc_plain_matched",
    "auc_oriented": "GREATEST(auc, 1 - auc)",
    "rejected": "COALESCE(p_adjusted <= 0.05, false)",
    "excludes_zero": "low > 0 OR high < 0",
    "harm_ratio": "harm_plain / NULLIF(harm_gated, 0)",
    "harm_reduction": "harm_plain - harm_gated",
    "compression": "1 / kept_kv",
    "p_all_open": "POWER(p_open, batch_size)",
    "provisioned": "(1 - p_all_open) + p_all_open * kept_open",
    "rho_ratio": "rho_per_layer / NULLIF(rho_single, 0)",
    "ordered": "margin > 0",
    "closed_call": "p_open < 0.5",
    "smallest": "rank = 1",
    "identical": "p_open_rest = 1",
    "degenerate": formulas.DEGENERATE,
    "tau_calibrated": "(mean_drop_capacity + mean_drop_dilution) / 2",
    "winner": "CASE WHEN delta_calibrated > delta_fixed THEN 'calibrated' "
              "WHEN delta_calibrated < delta_fixed THEN 'fixed' ELSE 'tie' END",
}

#: table name → {tidy name: formula} where a column is computed otherwise there.
FORMULAS_BY_TABLE: dict[str, dict[str, str]] = {
    "tab10_layers": {"margin": "dilution_min - capacity_max"},
    "tabA31_k_sweep": {"margin": "dilution_min - capacity_max"},
    "tab01_recovery": {"under_powered": "low < 0.05 AND 0.05 <= high"},
    "tab28_bootstrap": {"under_powered": "low < 0 AND 0 <= high"},
    "tab13_budget_axis": {"delta": "acc_gated - acc_plain"},
    "tab22_compression": {"compression": "1 / kept_kv_gated",
                          "kept_kv_gated": "p_open * COALESCE(kept_kv_open, 0) + (1 - p_open)"},
    "tab23_batching": {"compression": "1 / provisioned"},
    "headline": {"compression": "1 / kept_kv_budget",
                 "compression_batch": f"1 / ((1 - POWER(p_open, {_B})) + POWER(p_open, {_B}) * COALESCE(kept_open, 0))"},
}


def formula(table: str, column: str) -> str | None:
    """The formula of ``column`` in ``table`` over the other columns of its row, or ``None``."""
    return FORMULAS_BY_TABLE.get(table, {}).get(column, FORMULAS.get(column))


def _entry(table: str, column: str) -> tuple[str, str]:
    if column in BY_TABLE.get(table, {}):
        return BY_TABLE[table][column]
    return COLUMNS.get(column, (column.replace("_", " "), ""))


def header(table: str, column: str) -> str:
    """The header shown for ``column`` of ``table``."""
    return _entry(table, column)[0]


def glossary(table: str, columns) -> list[tuple[str, str, str]]:
    """``(header, tidy name, meaning)`` for each of ``columns`` of ``table``, in order; a derived
    column's meaning ends with its formula (``= …``) when the table holds every column it reads."""
    columns = list(columns)
    out = []
    for c in columns:
        head, meaning = _entry(table, c)
        f = formula(table, c)
        if f is not None and _reads(f) <= set(columns) - {c}:
            meaning = f"{meaning} (= {f})" if meaning else f"= {f}"
        out.append((head, c, meaning))
    return out


def formula_checks(out) -> list[tuple[str, str, str, bool]]:
    """Evaluate every derived column's formula on a written report's own rows.

    Parameters
    ----------
    out : path-like
        A report folder (``index.json`` and ``tables/*.csv``).

    Returns
    -------
    list of (table, column, formula, holds)
        One entry per derived column whose table holds every column its formula reads; the
        headline's rows (``index.json``) are checked under the table name ``headline``.
        ``holds`` is true when the formula equals the column on every row (nulls and NaNs in
        the same places, numbers within 1e-12).
    """
    out = Path(out)
    frames = {}
    for csv in sorted((out / "tables").glob("*.csv")):
        frame = pl.read_csv(csv, infer_schema_length=None)
        frames[csv.stem] = frame.with_columns(  # a column empty on every row is read as text
            pl.col(c).cast(pl.Float64) for c in frame.columns
            if frame[c].dtype == pl.String and frame[c].null_count() == frame.height)
    headline = json.loads((out / "index.json").read_text())["headline"]
    if headline:
        frames["headline"] = pl.DataFrame(headline)
    checks = []
    for table, frame in frames.items():
        for column in frame.columns:
            f = formula(table, column)
            if f is not None and _reads(f) <= set(frame.columns) - {column}:
                got = frame.select(pl.sql_expr(f).alias(column))[column]
                checks.append((table, column, f, _same(got, frame[column])))
    return checks


def _same(got, want) -> bool:
    if (got.is_null() != want.is_null()).any():
        return False
    keep = want.is_not_null()
    got, want = got.filter(keep), want.filter(keep)
    if not want.dtype.is_numeric():
        return got.cast(want.dtype).to_list() == want.to_list()
    got, want = got.cast(pl.Float64), want.cast(pl.Float64)
    if (got.is_nan() != want.is_nan()).any():
        return False
    return bool(((got - want).abs() <= 1e-12).filter(~want.is_nan()).all())


def _reads(sql: str) -> set[str]:
    """The column names a formula reads (its identifiers that are not SQL words or literals)."""
    words = {"CAST", "AS", "DOUBLE", "NULLIF", "GREATEST", "COALESCE", "POWER", "CASE", "WHEN", "THEN",
             "ELSE", "END", "AND", "OR", "NOT", "true", "false"}
    return {w for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", re.sub(r"'[^']*'", "", sql)) if w not in words}
