"""Do two collections of the same prompts give the same outcomes? (e.g. two decode paths)

For the (task, input_id) both runs hold: is the prompt the same, how far apart is D, and is every
full-KV answer and every arm's (evictor, budget) prediction, score and kept count equal. Reads the
parquet part files of each run folder directly (finished parts or a compacted run alike).

With ``--decode-limits`` (a re-collection with longer decode limits, schema v2, of a run whose
limits cut answers) it checks instead what must not change and what must: D and every kept count
identical; every arm whose new decode stopped at EOS within the old limit identical; every old
prediction a prefix of the new one where the new decode ran past the old limit; and the scores and
the collection's cost per input (prefill + decode, seconds) before and after, per task.

Usage: ``python bench/compare_runs.py OLD_RUN NEW_RUN [--decode-limits] [--out NAME]``; writes
``bench/results/NAME.json`` (default ``compare_runs``) and prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_result  # noqa: E402

KEY = ["task", "input_id"]


def _read(run: str, table: str) -> pl.DataFrame:
    files = sorted((Path(run) / table).glob("*.parquet"))
    if not files:
        raise SystemExit(f"{run}: no {table} parquet files")
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")


def compare(old: str, new: str) -> dict:
    inputs = _read(old, "inputs").join(_read(new, "inputs"), on=KEY, suffix="_new")
    arms = _read(old, "outcomes").join(_read(new, "outcomes"), on=[*KEY, "evictor", "budget"], suffix="_new")
    differing = arms.filter(pl.col("prediction") != pl.col("prediction_new"))
    return {
        "old": old, "new": new,
        "inputs_in_both": inputs.height,
        "prompts_equal": int((inputs["prompt"] == inputs["prompt_new"]).sum()),
        "max_abs_drop_diff": float((inputs["drop"] - inputs["drop_new"]).abs().max()),
        "full_predictions_equal": int((inputs["full_prediction"] == inputs["full_prediction_new"]).sum()),
        "arms_in_both": arms.height,
        **{f"{c}_equal": int((arms[c] == arms[f"{c}_new"]).sum()) for c in ("prediction", "score", "n_kept")},
        "first_differing_arms": differing.select(*KEY, "evictor", "budget", "prediction", "prediction_new")
        .head(10).to_dicts(),
    }


def _limits(run: str) -> dict[str, int]:
    import json

    options = json.loads((Path(run) / "manifest.json").read_text()).get("task_options", {})
    return {t: int(o["max_new_tokens"]) for t, o in options.items()}


def limit_comparison(old: str, new: str) -> dict:
    """What a re-collection with longer decode limits keeps and changes (module docstring)."""
    old_limit = _limits(old)
    new_limit = _limits(new)
    inputs = _read(old, "inputs").join(_suffixed(_read(new, "inputs"), KEY), on=KEY)
    limit = pl.col("task").replace_strict(old_limit, return_dtype=pl.Int64)
    full = inputs.select(*KEY, pl.col("full_prediction").alias("prediction"),
                         pl.col("full_prediction_new").alias("prediction_new"), pl.col("full_score").alias("score"),
                         pl.col("full_score_new").alias("score_new"), pl.col("full_n_generated_new").alias("n_generated_new"),
                         pl.col("full_stop_reason_new").alias("stop_reason_new"), pl.lit("full").alias("evictor"),
                         pl.lit(1.0).alias("budget"), pl.lit(0).alias("n_kept"), pl.lit(0).alias("n_kept_new"))
    arms = _read(old, "outcomes").join(_suffixed(_read(new, "outcomes"), [*KEY, "evictor", "budget"]),
                                       on=[*KEY, "evictor", "budget"]).filter(
        pl.col("budget") < 1).select(*KEY, "evictor", "budget", "prediction", "prediction_new", "score", "score_new",
                                     "n_generated_new", "stop_reason_new", "n_kept", "n_kept_new")
    rows = pl.concat([full, arms], how="diagonal_relaxed").with_columns(limit.alias("old_limit"))
    within = rows.filter((pl.col("n_generated_new") < pl.col("old_limit")) & (pl.col("stop_reason_new") == "eos"))
    past = rows.filter(pl.col("n_generated_new") >= pl.col("old_limit"))
    not_prefix = past.filter(~pl.col("prediction_new").str.starts_with(pl.col("prediction")))
    # the loop reading of pagestats validate on the old (cut) text: did going on change the score?
    from pagestats.io.decoding import text_flags

    past = past.with_columns(text_flags(past["prediction"], [[]] * past.height)["looping"].alias("old_looping"))
    loops = past.filter(pl.col("old_looping"))
    full_rows = rows.filter(pl.col("evictor") == "full")
    per_task = (rows.group_by("task", pl.col("evictor") == "full").agg(
        pl.len().alias("n"), pl.col("score").mean().alias("score_old"), pl.col("score_new").mean().alias("score_new"),
        (pl.col("score_new") > pl.col("score")).sum().alias("n_score_up"),
        (pl.col("score_new") < pl.col("score")).sum().alias("n_score_down"),
        (pl.col("stop_reason_new") == "length").mean().alias("share_length_new"))
        .rename({"evictor": "full_kv"}).sort("task", "full_kv", descending=[False, True]))
    cost = (inputs.group_by("task").agg(pl.len().alias("n_inputs"),
                                        (pl.col("prefill_ms") / 1e3).mean().alias("prefill_s_old"),
                                        (pl.col("prefill_ms_new") / 1e3).mean().alias("prefill_s_new"))
            .join(_decode_seconds(old).join(_suffixed(_decode_seconds(new), KEY), on=KEY)
                  .group_by("task").agg(pl.col("decode_s").mean().alias("decode_s_old"),
                                        pl.col("decode_s_new").mean()), on="task").sort("task"))
    return {
        "old": old, "new": new, "old_limits": old_limit, "new_limits": new_limit,
        "inputs_in_both": inputs.height,
        "prompts_equal": int((inputs["prompt"] == inputs["prompt_new"]).sum()),
        "drop_equal": int((inputs["drop"] == inputs["drop_new"]).sum()),
        "max_abs_drop_diff": float((inputs["drop"] - inputs["drop_new"]).abs().max()),
        "gate_decisions_equal_at_tau_0.07": int(((inputs["drop"] >= 0.07) == (inputs["drop_new"] >= 0.07)).sum()),
        "arms_in_both": arms.height,
        "n_kept_equal": int((arms["n_kept"] == arms["n_kept_new"]).sum()),
        "stopped_at_eos_within_old_limit": within.height,
        "of_them_unchanged": int((within["prediction"] == within["prediction_new"]).sum()),
        "of_them_unchanged_but_whitespace": int((within["prediction"].str.replace_all(r"\s", "")
                                                 == within["prediction_new"].str.replace_all(r"\s", "")).sum()),
        "ran_past_old_limit": past.height,
        "of_them_old_is_prefix_of_new": past.height - not_prefix.height,
        "ran_past_old_limit_looping_at_it": loops.height,
        "of_them_score_changed": int((loops["score"] != loops["score_new"]).sum()),
        "of_them_score_up": int((loops["score_new"] > loops["score"]).sum()),
        "ran_past_old_limit_not_looping": past.height - loops.height,
        "of_them_score_changed_not_looping": int((past.filter(~pl.col("old_looping"))["score"]
                                                  != past.filter(~pl.col("old_looping"))["score_new"]).sum()),
        "not_prefix_examples": not_prefix.select(*KEY, "evictor", "budget", "prediction", "prediction_new")
        .head(5).to_dicts(),
        "full_kv_accuracy_old": float(full_rows["score"].mean()),
        "full_kv_accuracy_new": float(full_rows["score_new"].mean()),
        "per_task": per_task.to_dicts(),
        "cost_per_input_s": cost.to_dicts(),
    }


def _suffixed(frame: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Every column but ``key`` renamed with ``_new`` (the new run's side of a join)."""
    return frame.rename({c: f"{c}_new" for c in frame.columns if c not in key})


def _decode_seconds(run: str) -> pl.DataFrame:
    return _read(run, "outcomes").group_by(KEY).agg((pl.col("decode_ms").sum() / 1e3).alias("decode_s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--decode-limits", action="store_true",
                    help="NEW re-collects OLD with longer decode limits: check what must stay and what may change")
    ap.add_argument("--out", default="compare_runs", help="results name: bench/results/NAME.json")
    args = ap.parse_args()
    result = limit_comparison(args.old, args.new) if args.decode_limits else compare(args.old, args.new)
    write_result(args.out, {"benchmark": "compare_runs", **result})


if __name__ == "__main__":
    main()
