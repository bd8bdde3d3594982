"""Write the example notebooks of ``notebooks/``; ``--execute`` also runs them on the shipped logs.

Run ``make notebooks`` (this script with ``--execute``) after editing a cell here: the committed
``.ipynb`` files are this script's cells, executed against ``data/`` with their outputs, so that
they show their figures before anyone runs them. Each notebook's metadata
(``pagestats.min_images``) states how many figures it shows at least; the tests execute every
notebook and check that count. Every notebook reads its logs from the
environment variable ``PAGESTATS_LOGS`` (a run directory, a folder of runs, or a glob);
the default is ``../data/smollm2-*`` (the runs shipped in ``data/``, seen from ``notebooks/``, without the
Table 31 control run of ``data/controls/``). With
``PAGESTATS_DB`` set to a database written by ``pagestats index LOGS --db FILE``, the logs are
read through it instead (validated when it was built, so not again). ``PAGESTATS_MODE`` picks the
collection mode (``query-aware``, the default, or ``query-agnostic``; docs/CLI.md). A
``PAGESTATS_LOGS`` that holds no run stops the notebook with an error naming it; only when it is
unset and ``../data/smollm2-*`` names no run does the notebook draw small synthetic logs
(:func:`pagestats.testing.synthetic_logs`) into a temporary folder, and says so.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''%matplotlib inline
import glob, os, tempfile
from pathlib import Path

import numpy as np
import polars as pl
from IPython.display import Markdown, display

from pagestats import io, metrics, replay, tables
from pagestats.replay import whatif
from pagestats.replay.policies import FixedTau, Midpoint, ZScored

# Where the logs are: PAGESTATS_LOGS (run directory, folder of runs, or glob); default ../data/smollm2-* (the shipped
# logs, without the Table 31 control run in ../data/controls/, which repeats smollm2-512's prompts).
# A PAGESTATS_LOGS that names no run is an error; only the default falls back to a synthetic demo.
LOGS = os.environ.get("PAGESTATS_LOGS", "../data/smollm2-*")


def find_runs(location):
    p = Path(location)
    if any(ch in location for ch in "*?["):
        return sorted(str(Path(m)) for m in glob.glob(location))
    if p.is_file():
        return [location]
    return sorted(str(m.parent) for m in p.glob("**/manifest.json")) if p.exists() else []


paths = find_runs(LOGS)
if not paths and "PAGESTATS_LOGS" in os.environ:
    raise FileNotFoundError(f"PAGESTATS_LOGS={LOGS!r} names no run (no manifest.json there): point it at a run "
                            "directory, a folder of runs or a glob, or unset it to read ../data/smollm2-*")
if not paths:
    from pagestats import testing
    tmp = Path(tempfile.mkdtemp(prefix="pagestats-demo-"))
    syn = testing.synthetic_logs(models={"demo-12L4H": (12, 4)}, evictors=("snapkv", "h2o"),
                                 tasks=("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe"),
                                 context_lengths=(4096, 16384), n_inputs=20, budgets=(0.125, 0.25, 0.5, 1.0),
                                 with_topk=True, k_max=32, with_text=False)
    paths = [str(r) for r in syn.write(tmp)]
    print(f"No runs under {LOGS!r}: using synthetic logs with a planted partition in {tmp}")
print(f"{len(paths)} run(s)")

# Or a database written by `pagestats index LOGS --db FILE` (validated when it was built).
DB = os.environ.get("PAGESTATS_DB")
# The collection mode to analyse: PAGESTATS_MODE, query-aware (the paper's setting) or query-agnostic;
# runs of the other mode are left out (never pooled into the same cells), and the notebook says so.
MODE = os.environ.get("PAGESTATS_MODE", "query-aware")


def load_logs():
    if DB:
        db = io.open_logs(DB)
        if db.mode != MODE:
            raise ValueError(f"{DB} holds {db.mode} runs, not {MODE}: index those with pagestats index --mode {MODE}")
        return db.load()
    logs = io.load(paths, mode=MODE)
    for line in logs.exclusions:
        print(line)
    return logs'''


def quickstart():
    return [
        new_markdown_cell("# Quick start\n\nLoad PAGE logs, validate them, and replay the gate offline: one "
                          "what-if at a fixed threshold τ and one with the z-scored threshold "
                          "(App. A.3.4), then Figure 3. Set `PAGESTATS_LOGS` to point at your runs."),
        new_code_cell(SETUP),
        new_markdown_cell("## Validate and load\n\n`io.validate_paths` lists every problem (file and row); "
                          "`io.load` raises on any."),
        new_code_cell('problems = [] if DB else io.validate_paths(paths)\nprint("valid" if not problems else "\\n".join(map(str, problems)))\n'
                      'logs = load_logs()\nprint(logs.inputs.height, "inputs,", logs.outcomes.height, "outcome rows")\n'
                      'logs.inputs.select("model", "context_length", "task", "task_class").unique().sort("model", "context_length", "task")'),
        new_markdown_cell("## What if τ = 0.07? And with the z-scored threshold?\n\nOne row per (model, context, "
                          "evictor, task, budget) — the table `pagestats whatif` prints."),
        new_code_cell('fixed = whatif.whatif_table(logs, FixedTau(0.07))\nfixed.head(10)'),
        new_code_cell('z = whatif.whatif_table(logs, ZScored(theta_z=-0.69, pilot_n=100))\n'
                      '# the library\'s summary (what `pagestats whatif` prints): means over inputs and budgets b < 1\n'
                      'summary = pl.concat([\n'
                      '    whatif.whatif_summary(fixed).with_columns(pl.lit("fixed 0.07").alias("policy")),\n'
                      '    whatif.whatif_summary(z).with_columns(pl.lit("z-scored").alias("policy")),\n'
                      '])\n'
                      'summary'),
        new_markdown_cell("## Figure 3: accuracy vs budget, plain (solid) and gated (dashed)"),
        new_code_cell('from pagestats.core.columns import headline_evictor\nfrom pagestats.figures import accuracy_vs_budget\n\n'
                      'gated = replay.gated_outcomes(logs, FixedTau(0.07))\n'
                      'ev = headline_evictor(gated["evictor"].unique())\n'
                      'cell = gated.select("model", "context_length").unique().sort("model", "context_length").row(0, named=True)\n'
                      'fig = accuracy_vs_budget(gated.filter(pl.col("evictor") == ev), evictor=ev, **cell)\n'
                      'fig'),
        new_markdown_cell("## Choose τ: the τ explorer\n\nLeft: gated accuracy against the kept KV cache for every "
                          "threshold τ and budget b, one colour per evictor; the line is each evictor's frontier, the "
                          "open circles the points at the chosen τ (one per budget), the top axis the cache in GiB per "
                          "sequence (from the manifest). Right: Figure 6, Δ and the error rates against τ, with the "
                          "chosen τ marked. The titles give p_open and Δ at that τ. Below at τ = 0.07; the next cell is "
                          "a slider (needs `ipywidgets`, part of the `notebooks` extra)."),
        new_code_cell('from pagestats.figures import decision_frontier, tau_sensitivity\n'
                      'from pagestats.report.context import Context\n'
                      'from pagestats.report.decision import decision_data\n\n'
                      'frontier = decision_data(Context(logs))    # every (τ, b) point of every evictor, one query\n'
                      'grid = np.sort(frontier.filter(pl.col("tau").is_finite())["tau"].unique().to_numpy())\n'
                      'curve = replay.tau_curve(logs, grid, by=("model", "context_length", "evictor"))\n\n\n'
                      'def explore(tau=0.07):\n'
                      '    tau = float(grid[np.argmin(np.abs(grid - tau))])\n'
                      '    at = curve.filter((pl.col("tau") == tau) & (pl.col("evictor") == ev)).sort("model", "context_length")\n'
                      '    said = "\\n".join(f"{r[\'model\']} {r[\'context_length\']}: p_open {r[\'p_open\']:.0%}, Δ {r[\'delta\'] * 100:+.1f} pp"\n'
                      '                     for r in at.iter_rows(named=True))\n'
                      '    left = decision_frontier(frontier, tau=tau)\n'
                      '    left.suptitle(f"τ = {tau:.4f}, {ev}:\\n{said}", fontsize=6)\n'
                      '    right = tau_sensitivity(curve.filter(pl.col("evictor") == ev), tau0=tau)  # Figure 6, τ marked\n'
                      '    display(left, right)\n\n\n'
                      'explore(0.07)'),
        new_code_cell('try:\n'
                      '    import ipywidgets as widgets\n'
                      '    widgets.interact(explore, tau=widgets.FloatSlider(value=0.07, min=float(grid.min()), max=float(grid.max()),\n'
                      '                                                      step=0.0025, readout_format=".4f", continuous_update=False))\n'
                      'except ImportError:\n'
                      '    print("ipywidgets is not installed (pip install -e \'.[notebooks]\'): static sweep")\n'
                      '    display(curve.filter(pl.col("evictor") == ev).filter(pl.col("tau").is_in(grid[::8].tolist()))\n'
                      '            .pivot(on="tau", index=["model", "context_length"], values="delta"))'),
    ]


def report_notebook():
    return [
        new_markdown_cell("# Regenerate the paper's figures and tables\n\nThe whole report, written once from the logs "
                          "(`report.build_report`, as `pagestats report LOGS --out DIR --no-pdf`): its headline, then "
                          "every figure of the catalogue shown inline from the report's files (an entry whose data are "
                          "missing says why it is skipped), then a few of its tables typeset. Each figure is drawn once, "
                          "by the report; `pagestats.figures` draws any of them as a matplotlib figure (notebook 01)."),
        new_code_cell(SETUP),
        new_markdown_cell("## The whole report, one page\n\n`report.build_report` writes every table and figure and "
                          "`index.html`: the headline numbers first, every figure, every table with a glossary of its "
                          "columns, the skipped entries, then the file hashes; `index.json` lists every output."),
        new_code_cell('import json\n\n'
                      'from pagestats import report\n\n'
                      'logs = load_logs()\n'
                      'out = Path(tempfile.mkdtemp(prefix="pagestats-report-"))\n'
                      'index = Path(report.build_report(logs, out, formats=("png",)))    # the replays, computed once\n'
                      'built = json.loads(index.with_name("index.json").read_text())\n'
                      'print("open", index.with_name("index.html"))\n'
                      'display(Markdown(index.read_text().split("## Figures")[0]))'),
        new_markdown_cell("## Every figure of the catalogue"),
        new_code_cell('from IPython.display import Image\n\n'
                      'for entry in built["outputs"]:\n'
                      '    if entry["kind"] != "figure":\n'
                      '        continue\n'
                      '    if entry["skipped"]:\n'
                      '        print(f"{entry[\'source\']} ({entry[\'name\']}) skipped: {entry[\'skipped\']}")\n'
                      '        continue\n'
                      '    for file in entry["files"]:\n'
                      '        part = Path(file).stem[len(entry["name"]) + 1:].replace("-", " ")\n'
                      '        display(Markdown(f"**{entry[\'source\']}** {part} — {entry[\'caption\']}"), Image(filename=out / file))'),
        new_markdown_cell("## A few tables, typeset\n\nEach table is a tidy frame of numbers (the report's CSV); "
                          "`tables.to_gt` typesets it."),
        new_code_cell('t2 = pl.read_csv(out / "tables" / "tab02_delta_matrix.csv")\n'
                      'tables.to_gt(t2, tables.LAYOUTS["tab02_delta_matrix"])'),
        new_code_cell('t1 = pl.read_csv(out / "tables" / "tab01_recovery.csv")\n'
                      'tables.to_gt(t1.filter(pl.col("scope") == "pooled"), tables.LAYOUTS["tab01_recovery"])'),
    ]


def calibration_notebook():
    return [
        new_markdown_cell("# Calibration and transfer\n\nThree ways to choose τ (Table 8): the fixed τ = 0.07, the "
                          "z-scored threshold τ_M = μ_M + θ_z σ_M from an unlabelled pilot (App. A.3.4), and the 40-input "
                          "midpoint recipe (Eq. 5). Then the question the paper leaves open: how much does the z-scored "
                          "gate depend on the definition of its pilot?"),
        new_code_cell(SETUP),
        new_code_cell('logs = load_logs()\n'
                      '# Eq. 5 takes 20 inputs of each class per (model, context): the midpoint is computed where they are\n'
                      'mid = Midpoint()\n'
                      'mid_logs, short = mid.applicable(logs)\n'
                      'for r in short.iter_rows(named=True):\n'
                      '    print(f"no midpoint τ for {r[\'model\']} at {r[\'context_length\']} tokens: {r[\'note\']}")\n'
                      'policies = {"fixed 0.07": (FixedTau(0.07), logs), "z-scored": (ZScored(), logs), "midpoint": (mid, mid_logs)}\n'
                      'rows = []\n'
                      'for name, (policy, source) in policies.items():\n'
                      '    g = replay.gated_outcomes(source, policy)\n'
                      '    rel = metrics.relation(g)  # the rows as a DuckDB relation: every metric is SQL over it\n'
                      '    d = metrics.delta(rel, by=("model", "context_length"))\n'
                      '    po = metrics.p_open(rel, by=("model", "context_length")).select("model", "context_length", "p_open")\n'
                      '    tau = g.group_by("model", "context_length").agg(pl.col("tau").mean())\n'
                      '    rows.append(d.join(po, on=["model", "context_length"]).join(tau, on=["model", "context_length"])\n'
                      '                .with_columns(pl.lit(name).alias("policy")))\n'
                      'compare = pl.concat(rows).select("policy", "model", "context_length", "tau", "p_open", "delta")\n'
                      'compare.pivot(on="policy", index=["model", "context_length"], values="delta")'),
        new_markdown_cell("## Where each threshold falls\n\nFigure 2 (D per input by task) with the fixed τ and the "
                          "midpoint τ of each cell; the z-scored τ differs per model (printed in the table above)."),
        new_code_cell('from pagestats.figures import drop_by_task\n\n'
                      'gate = replay.gate(mid_logs, mid)\n'
                      'fig = drop_by_task(gate, tau=float(gate["tau"].mean()))\n'
                      'fig.suptitle(f"dashed: midpoint τ = {float(gate[\'tau\'].mean()):.4f} (mean over cells); fixed τ = 0.07", fontsize=6)\n'
                      'fig'),
        new_markdown_cell("## Table 7: the midpoint recipe vs the fixed τ"),
        new_code_cell('t7 = tables.calibration_table(logs)\ntables.to_gt(t7, tables.LAYOUTS["tab07_calibration"])'),
        new_markdown_cell("## Pilot-definition sensitivity (new)\n\nPilot = first vs random inputs, pooled per model vs "
                          "per (model, context), three pilot sizes. `flips` marks a task whose gate call (closed iff "
                          "fewer than half its inputs open) differs from the reference pilot (the default z-scored pilot: 100 held-out inputs per model)."),
        new_code_cell('sens = tables.pilot_sensitivity_table(logs, pilot_sizes=(20, 50, 100))\n'
                      'sens.group_by("pilot_split", "pilot_by", "pilot_n").agg(\n'
                      '    pl.col("tau").mean().alias("mean_tau"), pl.col("flips").sum().alias("flipped_calls"),\n'
                      '    pl.col("delta_cell").mean().alias("mean_delta")).sort("pilot_split", "pilot_by", "pilot_n")'),
        new_code_cell('sens.filter(pl.col("n_flipping_definitions") > 0).select(\n'
                      '    "model", "context_length", "task", "n_flipping_definitions").unique().sort("model", "context_length", "task")'),
        new_code_cell('from matplotlib.figure import Figure\n\n'
                      'per = sens.group_by("pilot_split", "pilot_by", "pilot_n").agg(pl.col("tau").mean()).sort("pilot_n")\n'
                      'fig = Figure(figsize=(5.6, 2.4), layout="constrained")\n'
                      'ax = fig.subplots()\n'
                      'for (pilot_split, pilot_by), g in per.group_by("pilot_split", "pilot_by", maintain_order=True):\n'
                      '    ax.plot(g["pilot_n"], g["tau"], marker="o", label=f"{pilot_split} inputs, per {pilot_by}")\n'
                      'ax.axhline(0.07, color="0.5", linestyle=":", label="fixed τ = 0.07")\n'
                      'ax.set_xlabel("pilot size"); ax.set_ylabel("mean z-scored τ")\n'
                      'ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)  # beside the lines\n'
                      'fig'),
    ]


def depth_notebook():
    return [
        new_markdown_cell("# The depth profile\n\nD is one contrast of the per-layer agreement profile a_ℓ. The stored "
                          "profile lets us replay it on layer subsets (Table 10), head-pair subsets (Table 9), other k "
                          "(App. A.3.1, needs stored top-k), and try new signals — the open problem of §6 — with "
                          "per-input AUCs corrected for multiplicity (Benjamini–Hochberg)."),
        new_code_cell(SETUP),
        new_code_cell('from pagestats.figures import agreement_profile\n\n'
                      'logs = load_logs()\n'
                      'agreement_profile(logs.inputs)    # Figure 5: a_ℓ per task, the early and late bins of D shaded'),
        new_code_cell('t10 = tables.layer_subset_table(logs)\n'
                      't10.pivot(on="layers", index=["model", "context_length"], values="margin")'),
        new_code_cell('t9 = tables.head_pair_table(logs, fractions=(0.05, 0.25, 1.0), pair_draws=5)\nt9'),
        new_markdown_cell("## Another k (from the stored top-k indices)"),
        new_code_cell('if logs.topk is not None and logs.topk.height:\n'
                      '    for k in (8, 16, 32):\n'
                      '        g = replay.gate(logs, FixedTau(), replay.ProfileSpec(k=k))\n'
                      '        m = tables.ordering_margin(metrics.on_frame(metrics.task_means, g, "drop"))\n'
                      '        print(f"k={k}:", m.select("model", "context_length", "margin").rows())\n'
                      'else:\n'
                      '    print("skipped: these logs have no topk table")'),
        new_markdown_cell("## A custom gate signal, written here\n\nExample: the mid-depth dip, mean a_ℓ over the middle "
                          "third minus the mean over the first and last layers. Any function of the stored frame works: "
                          "as a signal (AUC) and as a gate (`CustomPolicy`)."),
        new_code_cell('from pagestats.replay.policies import CustomPolicy\n\n'
                      'def mid_dip(frame):\n'
                      '    a = np.stack(frame["agreement"].to_list()).astype(np.float64)\n'
                      '    L = a.shape[1]\n'
                      '    mid = a[:, L // 3: L - L // 3].mean(axis=1)\n'
                      '    return (a[:, [0, -1]].mean(axis=1) - mid)\n\n'
                      'base = replay.gate(logs, FixedTau())\n'
                      'meta = logs.inputs.select("run_id", "task", "input_id", "agreement")\n'
                      'custom = base.join(meta, on=["run_id", "task", "input_id"], maintain_order="left")\n'
                      'custom = custom.with_columns(pl.Series("drop", mid_dip(custom)))\n'
                      'frames = {s: replay.gate(logs, FixedTau(), replay.ProfileSpec(statistic=s))\n'
                      '          for s in ("drop", "late_plateau", "slope", "decreasing_fraction")}\n'
                      'frames["mid_dip (custom)"] = custom\n'
                      'aucs = tables.auc_table(frames, by=("model", "context_length"))\n'
                      'aucs.select("statistic", "model", "context_length", "auc", "low", "high", "p_value", "p_adjusted", "rejected")'),
        new_code_cell('from matplotlib.figure import Figure\n\n'
                      'fig = Figure(figsize=(4.5, 2.4), layout="constrained")\n'
                      'ax = fig.subplots()\n'
                      'shown = aucs.sort("statistic", "model", "context_length")\n'
                      'labels = [f"{s} {c}" for s, c in zip(shown["statistic"], shown["context_length"])]\n'
                      'x = np.arange(shown.height)\n'
                      'ax.bar(x, shown["auc"], color=["#1f77b4" if r else "0.7" for r in shown["rejected"]])\n'
                      'ax.errorbar(x, shown["auc"], yerr=[shown["auc"] - shown["low"], shown["high"] - shown["auc"]], fmt="none", ecolor="0.2")\n'
                      'ax.axhline(0.5, color="0.5", linestyle=":")\n'
                      'ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=6)\n'
                      'ax.set_ylabel("AUC (95% DeLong); blue: BH-significant")\n'
                      'fig'),
        new_code_cell('threshold = float(custom["drop"].median())\n'
                      'policy = CustomPolicy(lambda f: mid_dip(f) >= threshold, name="mid_dip ≥ median")\n'
                      'g = replay.gated_outcomes(logs, policy)\n'
                      'metrics.delta(metrics.relation(g), by=("model", "context_length", "evictor"))'),
    ]


NOTEBOOKS = {
    "01_quickstart.ipynb": quickstart,
    "02_regenerate_paper.ipynb": report_notebook,
    "03_calibration_transfer.ipynb": calibration_notebook,
    "04_depth_profile.ipynb": depth_notebook,
}
#: Figures each notebook shows at least, on the shipped logs (``metadata.pagestats.min_images``).
MIN_IMAGES = {
    "01_quickstart.ipynb": 3,           # Fig. 3, the decision figure and Fig. 6 at τ = 0.07
    "02_regenerate_paper.ipynb": 10,    # every figure of the catalogue the logs support
    "03_calibration_transfer.ipynb": 2,  # Fig. 2 with the midpoint τ, τ against the pilot size
    "04_depth_profile.ipynb": 2,        # Fig. 5, the AUC of every signal
}


def build(folder: Path = HERE) -> list[Path]:
    """Write the notebooks' cells (no outputs) to ``folder``; return the paths."""
    out = []
    for name, cells in NOTEBOOKS.items():
        stem = name.split("_")[0]
        cell_list = cells()
        for i, cell in enumerate(cell_list):
            cell["id"] = f"nb{stem}-{i:02d}"  # stable ids: rebuilding gives identical files
        nb = new_notebook(cells=cell_list, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "pagestats": {"min_images": MIN_IMAGES[name]}})
        path = folder / name
        nbformat.write(nb, path)
        out.append(path)
    return out


#: Seconds each cell of a headless run may take (``make notebooks``, the tests): a hang fails within 2 minutes,
#: named by its cell, inside a notebook test's own 2-minute limit (pytest-timeout).
CELL_TIMEOUT = 90


def client(nb: nbformat.NotebookNode, folder: Path, timeout: int = CELL_TIMEOUT):
    """The ``nbclient.NotebookClient`` of every headless run (``make notebooks``, the tests): the
    cells of ``nb`` run in ``folder``, each within ``timeout`` seconds (a kernel gets 60 s to start).

    nbclient's stand-in for the ipywidgets Output widget is switched off (``widget_registry``). It
    answers every output the widget captures (the τ explorer's slider in notebook 01) with a
    ``comm_msg`` on the shell channel, which jupyter_client sends through a raw copy of the
    asyncio socket; when the cell's ``execute_reply`` arrives at that moment, the raw send takes the
    socket's wake-up, and nbclient reads the reply only when the cell's timeout runs out (a suite
    run sat idle 900 s on that cell, then passed). Without the stand-in the figures of the slider's
    first draw are outputs of the cell itself.
    """
    import nbclient

    run = nbclient.NotebookClient(nb, timeout=timeout, startup_timeout=60, kernel_name="python3",
                                  resources={"metadata": {"path": str(folder)}})
    run.widget_registry = {}
    return run


def execute(path: Path, timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` in its own folder (so ``PAGESTATS_LOGS`` defaults to
    ``../data``) and write it back with its outputs; raise on an error in any cell."""
    nb = nbformat.read(path, as_version=4)
    client(nb, path.parent, timeout).execute()
    nbformat.write(nb, path)
    return nb


def image_outputs(nb) -> int:
    """How many figures (``image/png`` outputs) a notebook holds."""
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


if __name__ == "__main__":
    import sys

    for p in build():
        if "--execute" in sys.argv[1:]:
            n = image_outputs(execute(p))
            if n < MIN_IMAGES[p.name]:
                raise SystemExit(f"{p.name}: {n} figures, fewer than the {MIN_IMAGES[p.name]} it promises")
            print(p, f"({n} figures)")
        else:
            print(p)
