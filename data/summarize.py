"""Print the headline numbers of the shipped logs (quoted in data/README.md and the issue notes).

Run: ``.venv/bin/python data/summarize.py [RUN ...] > data/SUMMARY.md`` (default: every run under data/).
Everything is computed with pagestats from the logs alone, on the report's input set: the first input
draw of each (model, context) (``pagestats.report.context.first_draw``; a later draw is read by Table 30
alone), and the evictors of a cell on the same inputs with Table 28's bootstrap and seed, so that every
number here is the report's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

from pagestats import io, metrics, replay, tables
from pagestats.core import defaults
from pagestats.replay.policies import FixedTau, ZScored
from pagestats.report.context import first_draw

runs = sys.argv[1:] or sorted(str(m.parent) for m in Path(__file__).parent.glob("*/manifest.json"))
every_draw = io.load(runs)
logs = first_draw(every_draw)
pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=-1, fmt_str_lengths=100, tbl_formatting="MARKDOWN",
          tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True, float_precision=3)

inp = logs.inputs
per_input_s = (inp["prefill_ms"].sum() + logs.outcomes["decode_ms"].sum()) / 1000 / inp.height
later = every_draw.inputs.join(inp.select("run_id", "task", "input_id"), on=["run_id", "task", "input_id"], how="anti")
print(f"runs: {', '.join(Path(r).name for r in runs)}; {inp.height} inputs of the first draw of each (model, context) "
      f"(the report's input set); {logs.outcomes.height} outcome rows; {later.height} inputs of later draws "
      f"({', '.join(sorted(set(later['run_id'].cast(pl.String).to_list())))}) are read by Table 30 alone")
print(f"logged compute per input (prefill + all arms' decode): {per_input_s:.1f} s\n")

print("## Full-KV accuracy, mean D and gate-open fraction per (context, task)\n")
fixed = replay.gate(logs, FixedTau(0.07))
zs = replay.gate(logs, ZScored())
tab = (fixed.group_by("context_length", "task", "task_class")
       .agg(pl.len().alias("n"), pl.col("full_score").mean().alias("acc_full"),
            pl.col("drop").mean().alias("mean_D"), pl.col("drop").std().alias("sd_D"),
            pl.col("gate_open").mean().alias("p_open_tau0.07"))
       .join(zs.group_by("context_length", "task").agg(pl.col("gate_open").mean().alias("p_open_z"),
                                                         pl.col("tau").first().alias("tau_z")),
             on=["context_length", "task"])
       .sort("context_length", "mean_D"))
print(tab, "\n")

for name, policy in (("fixed τ = 0.07", FixedTau(0.07)), ("z-scored (θ = −0.69, pilot 100 per model)", ZScored())):
    g = replay.gated_outcomes(logs, policy)
    print(f"## Δ (gated − plain, budgets b < 1) per (context, evictor), {name}: cluster bootstrap, BH "
          "(Table 28: the evictors of a context on the same inputs)\n")
    d = tables.bootstrap_table(g, rng=np.random.default_rng(defaults.BOOTSTRAP_SEED))
    print(d.select([c for c in d.columns if c not in ("model", "excludes_zero")]), "\n")

g = replay.gated_outcomes(logs, FixedTau(0.07))
print("## Harm rate Pr[A(b,x) < A_full(x)] at b = 0.0625 and 0.25, plain vs gated (τ = 0.07), per task\n")
for arm in ("plain", "gated"):
    h = metrics.on_frame(metrics.harm_rate, g.filter(pl.col("budget").is_in([0.0625, 0.25])),
                         by=("context_length", "evictor", "task"), arm=arm)
    print(f"### {arm}\n")
    print(h.filter(pl.col("evictor") == "snapkv"), "\n")

print("## Evictors whose outcomes are identical on every input at a budget (Table 13's same_as)\n")
same = metrics.on_frame(metrics.identical_evictors, g, by=("model", "context_length", "budget")).filter(
    pl.col("same_as").is_not_null())
classes = same.select("context_length", "budget", pl.concat_list(pl.col("evictor").cast(pl.String),
                                                                 pl.col("same_as").str.split(", ")).list.sort()
                      .list.join(" = ").alias("identical evictors")).unique()
print(classes.sort("context_length", "budget", "identical evictors"), "\n")

print("## ρ (Eq. 1) per (context, task), SnapKV, Wilson 95 %\n")
print(metrics.on_frame(metrics.recovery_rate, g.filter(pl.col("evictor") == "snapkv"), by=("context_length", "task")),
      "\n")

# The query-agnostic runs (--mode query-agnostic: the context is prefilled and evicted before the
# question is appended) are read apart: they never pool with the query-aware cells above.
agnostic = [r for r in runs if json.loads((Path(r) / "manifest.json").read_text()).get("mode") == "query-agnostic"]
if agnostic:
    qa = io.load(agnostic, mode="query-agnostic")
    print(f"## Query-agnostic runs: {', '.join(Path(r).name for r in agnostic)}; {qa.inputs.height} inputs\n")
    gate = replay.gate(qa, FixedTau(0.07))
    print(gate.group_by("context_length", "task").agg(
        pl.len().alias("n"), pl.col("full_score").mean().alias("acc_full"), pl.col("drop").mean().alias("mean_D"),
        pl.col("gate_open").mean().alias("p_open_tau0.07")).sort("context_length", "mean_D"), "\n")
    g = replay.gated_outcomes(qa, FixedTau(0.07))
    print("### Δ (gated − plain, budgets b < 1) per evictor, fixed τ = 0.07: cluster bootstrap, BH\n")
    d = tables.bootstrap_table(g, rng=np.random.default_rng(defaults.BOOTSTRAP_SEED)).drop("excludes_zero")
    cell = ["context_length", "evictor"]
    # harm per budget (Table 27), averaged over the budgets b < 1 (each holds the same inputs)
    harm = [metrics.on_frame(metrics.harm_rate, g.filter(pl.col("budget") < 1), by=cell, arm=arm)
            .group_by(cell).agg(pl.col("harm").mean().alias(f"harm_{arm}")) for arm in ("plain", "gated")]
    print(d.select([c for c in d.columns if c != "model"]).join(harm[0], on=cell).join(harm[1], on=cell)
          .sort("delta", descending=True), "\n")
