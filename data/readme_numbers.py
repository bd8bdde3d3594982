"""Write the README's findings tables from the shipped logs, so that the numbers a reader sees are the
report's own (its headline: :func:`pagestats.report.headline.headline`).

Run ``.venv/bin/python data/readme_numbers.py`` (``make readme-numbers``) after the logs change: it
rewrites every block of README.md, docs/SMOLLM2.md and docs/USAGE.md between ``<!-- readme-numbers:NAME -->`` and
``<!-- /readme-numbers -->``. ``--check`` changes nothing and exits 1 when a block differs from what
the logs give (``tests/io/test_shipped_data.py`` runs it).

Blocks: ``page-release`` (the paper's own released logs: :func:`release`), ``calibration`` (the z-scored pilot's τ and the k sweep's τ), ``query-aware-512``, ``query-aware-1024`` and ``query-agnostic-512``: per evictor, the harm rate
plain → gated over every task and budget b < 1 and on the capacity-bound anchor NIAH-MK3 at b = 1/16 (Table 27's cell), Δ at matched memory (Table N3)
and Δ at the nominal budget (Table 28), each with its 95 % cluster-bootstrap interval and BH-adjusted p,
and the realized compression at b = 1/16 at batch 1 and 8 (Tables 22-23), sorted by Δ at matched memory; under the
table, the evictors whose outcomes are identical on every input at b = 1/16 (``metrics.identical_evictors``), whose
b = 1/16 columns therefore agree by construction.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import polars as pl

from pagestats import io, metrics
from pagestats.core import defaults
from pagestats.report.context import Context
from pagestats.report.headline import headline

ROOT = Path(__file__).resolve().parent.parent
#: How the README names each evictor.
LABELS = {
    "h2o": "H2O (paper: one mask over all layers and heads)",
    "h2o-perhead": "H2O per head (per layer and KV head)",
    "pyramidkv": "PyramidKV",
    "snapkv": "SnapKV (paper: one mask)",
    "snapkv-perhead": "SnapKV per head (window 32, as published)",
    "kvpress:SnapKVPress:window_size=32": "kvpress `SnapKVPress` (window 32)",
    "snapkv-perlayer": "SnapKV per layer",
    "streamingllm": "StreamingLLM",
}
BLOCK = re.compile(r"(<!-- readme-numbers:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /readme-numbers -->)", re.S)


def _runs(mode: str) -> list[str]:
    import json

    out = []
    for manifest in sorted((ROOT / "data").glob("*/manifest.json")):
        if json.loads(manifest.read_text()).get("mode", defaults.MODE) == mode:
            out.append(str(manifest.parent))
    return out


def _p(p) -> str:
    return "–" if p is None or p != p else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _pp(x: float) -> str:
    return f"{x * 100:+.1f}"


def _share(x) -> str:
    return "–" if x is None else f"{x * 100:.1f} %"


def _times(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def table(frame: pl.DataFrame) -> str:
    """One context's rows as the README's Markdown table (sorted by Δ at matched memory)."""
    lines = ["| evictor | n | harm, every task and b < 1, plain → gated | harm on NIAH-MK3 at b = 1/16, "
             "plain → gated | Δ at matched memory, pp [95 % CI] | p (BH) | Δ at nominal budget, pp [95 % CI] | p (BH) "
             "| compression at b = 1/16, batch 1 / 8 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in frame.sort("delta_matched", descending=True).iter_rows(named=True):
        lines.append(
            f"| {LABELS.get(r['evictor'], r['evictor'])} | {r['n_inputs']} "
            f"| {_share(r['harm_plain_all'])} → {_share(r['harm_gated_all'])} "
            f"| {_share(r['harm_plain'])} → {_share(r['harm_gated'])} "
            f"| {_pp(r['delta_matched'])} [{_pp(r['matched_low'])}, {_pp(r['matched_high'])}] | {_p(r['matched_p'])} "
            f"| {_pp(r['delta'])} [{_pp(r['low'])}, {_pp(r['high'])}] | {_p(r['p_adjusted'])} "
            f"| {_times(r['compression'])} / {_times(r['compression_batch'])} |")
    return "\n".join(lines) + "\n"


def calibration(logs) -> str:
    """The README's calibration paragraph: the z-scored pilot's τ and p_open as `pagestats whatif
    data/smollm2-*/ --policy z [--pilot-split first]` prints them, and the k sweep's recalibrated τ (the
    report's App. A.3.1 table)."""
    from pagestats import replay, tables
    from pagestats.replay import ZScored
    from pagestats.report.context import Context

    said = []
    for split in ("held-out", "first"):
        gate = replay.gate(logs, ZScored(pilot_split=split))
        said.append((float(gate["tau"].unique().item()), gate["gate_open"].mean(), gate.height))
    sweep = tables.k_sweep_table(Context(logs).logs)
    tau = {k: sweep.filter(pl.col("k") == k)["tau_gate"].unique().item() for k in (8, 16)}
    lo, hi = sweep.filter(pl.col("k").is_in([8, 16]))["p_open"].min(), sweep.filter(pl.col("k").is_in([8, 16]))["p_open"].max()
    return ("The z-scored pilot is drawn by a seeded hash of the input identity, so it does not depend on file or\n"
            "row order, and by default it is held out of every evaluated number (`--pilot-split\n"
            "{first,random,held-out}`). Its τ and its make-up (inputs per task, context and run) are printed on\n"
            f"stderr. On these logs the held-out pilot gives τ_z = {said[0][0]:.4f} (p_open {said[0][1]:.3f} on the "
            f"{said[0][2]} evaluated\ninputs); the in-sample \"first\" pilot gives {said[1][0]:.4f} (p_open "
            f"{said[1][1]:.3f} on all {said[1][2]}).\n"
            "The report's Tables 5–6, 9, 10 and the k sweep (App. A.3.1) recalibrate τ this way by default and\n"
            "report p_open and `degenerate` beside each row. On these logs the k sweep shows the paper's trap: at\n"
            "the fixed τ = 0.07 the gate opens on every input at k = 8 and k = 16 (degenerate), while τ\n"
            f"recalibrated with k ({tau[8]:.3f} at k = 8, {tau[16]:.3f} at k = 16) opens it on {lo:.0%}–{hi:.0%} of "
            "them.\n")


def release() -> str:
    """The README's lead table: the paper's own released logs (data/page-release/condensed, imported as
    ``make report`` does) per (model, evictor): accuracy plain → gated and Δ over b < 1 (Table 2's cell),
    with the report's 95 % cluster-bootstrap interval, the harm on NIAH-MK3 at b = 1/16 (Table 27's cell),
    p_open and the compression at b = 1/16 (Table 22). Yi-1.5-9B (no b = 1 rows) is in `whatif` and the
    conformance table, not here (docs/IMPORT.md)."""
    import tempfile

    from pagestats.io.imports import import_page
    from pagestats.replay.whatif import whatif_summary, whatif_table

    with tempfile.TemporaryDirectory() as tmp:
        runs = import_page([str(ROOT / "data" / "page-release" / "condensed")], tmp).runs
        complete = [d for d in runs.values() if io.load([d]).inputs["full_score"].null_count() == 0]
        logs = io.load(sorted(complete))
        lead = headline(Context(logs))
        acc = whatif_summary(whatif_table(logs), by=["model", "evictor"])
    rows = lead.with_columns(pl.col("model", "evictor").cast(pl.String)).join(
        acc.select(pl.col("model", "evictor").cast(pl.String), "acc_plain", "acc_gated"), on=["model", "evictor"])
    lines = ["| model (4K tokens) | evictor | n | accuracy, plain → gated | Δ, pp [95 % CI] | harm on NIAH-MK3 at b = 1/16, "
             "plain → gated | gate opens | compression at b = 1/16 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows.sort("model", "evictor").iter_rows(named=True):
        lines.append(f"| {r['model']} | {LABELS.get(r['evictor'], r['evictor']).split(' (')[0]} | {r['n_inputs']} "
                     f"| {_share(r['acc_plain'])} → {_share(r['acc_gated'])} "
                     f"| {_pp(r['delta'])} [{_pp(r['low'])}, {_pp(r['high'])}] "
                     f"| {_share(r['harm_plain'])} → {_share(r['harm_gated'])} | {_share(r['p_open'])} "
                     f"| {_times(r['compression'])} |")
    return "\n".join(lines) + "\n"


def blocks() -> dict[str, str]:
    out = {"page-release": release()}
    for mode in defaults.MODES:
        runs = _runs(mode)
        if not runs:
            continue
        logs = io.load(runs, mode=mode)
        if mode == defaults.MODE:
            out["calibration"] = calibration(logs)
        ctx = Context(logs)
        lead = headline(ctx)
        at_b = ctx.gated.filter(pl.col("budget") == defaults.HEADLINE_BUDGET)
        same = metrics.on_frame(metrics.identical_evictors, metrics.equal_inputs(at_b)[0], by=("context_length",))
        for (context,), part in lead.group_by(["context_length"], maintain_order=True):
            out[f"{mode}-{context}"] = table(part) + identical(same.filter(pl.col("context_length") == context))
    return out


def identical(same: pl.DataFrame) -> str:
    """The line under a table naming the evictors whose outcomes are identical on every input at b = 1/16."""
    classes = sorted({tuple(sorted([str(r["evictor"]), *r["same_as"].split(", ")]))
                      for r in same.filter(pl.col("same_as").is_not_null()).iter_rows(named=True)})
    if not classes:
        return ""
    named = "; ".join(", ".join(LABELS.get(e, e) for e in c) for c in classes)
    return (f"\nAt b = 1/16 the outcomes of {named} are identical on every input (`pagestats report`, Table 13's "
            "\"same outcomes as\"), so their b = 1/16 columns agree by construction, not as a finding.\n")


#: The pages whose ``readme-numbers`` blocks this script writes.
PAGES = ("README.md", "docs/SMOLLM2.md", "docs/USAGE.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is not current")
    args = ap.parse_args(argv)
    made = blocks()
    stale, missing = [], set(made)
    new_text = {}
    for page in PAGES:
        path = ROOT / page

        def fill(m: re.Match, page=page) -> str:
            name = m.group("name")
            if name not in made:
                raise SystemExit(f"{page} block {name!r}: the shipped logs have no such cell")
            missing.discard(name)
            if m.group("body") != made[name]:
                stale.append(f"{page}:{name}")
            return m.group(1) + made[name] + m.group(4)

        new_text[path] = BLOCK.sub(fill, path.read_text())
    if args.check:
        if stale:
            print(f"not current: blocks {', '.join(stale)} differ from the logs (run data/readme_numbers.py)",
                  file=sys.stderr)
            return 1
        return 0
    for path, text in new_text.items():
        path.write_text(text)
    print(f"{len(made) - len(missing)} blocks written to {', '.join(PAGES)}"
          + (f"; no block for {', '.join(sorted(missing))}" if missing else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
