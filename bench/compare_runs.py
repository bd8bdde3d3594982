"""Do two collections of the same prompts give the same outcomes? (e.g. two decode paths)

For the (task, input_id) both runs hold: is the prompt the same, how far apart is D, and is every
full-KV answer and every arm's (evictor, budget) prediction, score and kept count equal. Reads the
parquet part files of each run folder directly (finished parts or a compacted run alike).

Usage: ``python bench/compare_runs.py OLD_RUN NEW_RUN [--out NAME]``; writes
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--out", default="compare_runs", help="results name: bench/results/NAME.json")
    args = ap.parse_args()
    write_result(args.out, {"benchmark": "compare_runs", **compare(args.old, args.new)})


if __name__ == "__main__":
    main()
