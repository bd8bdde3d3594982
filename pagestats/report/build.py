"""The report: every table and figure of the catalogue, plus an index of what it was
computed from (docs/CLI.md ``pagestats report``; docs/SCHEMA.md "Safety": every report lists its files).

An entry whose requirement fails is *skipped* with a one-line reason written to the index —
never an exception, never an empty figure. Every replay is computed once per report; the
entries that never read the gated outcomes run first, before those are built (:func:`run_order`).

Outputs under ``out``: ``figures/<name>[-<part>].png|pdf``, ``tables/<name>.csv|md``
(``.html`` where the table is typeset), and the index: ``index.html`` (one self-contained page:
the headline numbers first, every figure embedded, every table with its column glossary, the skip
reasons, the provenance last), ``index.md`` (the same order) and ``index.json`` (log files with
sha256 and rows, exclusions, the policy, profile and defaults used, the headline, every output
and every skip reason).
"""

from __future__ import annotations

import contextlib
import hashlib

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

import pagestats
from pagestats.core import defaults
from pagestats.core.columns import names_like
from pagestats.metrics import engine
from pagestats.replay import ZScored, pilot_composition
from pagestats.report.conformance import conformance
from pagestats.report.context import Context, Entry, needs_inputs
from pagestats.report.headline import headline, headline_sentences
from pagestats.report.html import index_markdown, write_index_html
from pagestats.report.figure_entries import FIGURES
from pagestats.report.table_entries import TABLES
from pagestats.report.write import (
    FIGURE_FORMATS,
    _EmptyOutput,
    _table_parts,
    _write_figure,
    _write_table,
    staged_directory,
)
from pagestats.core.targets import report_problem

# --------------------------------------------------------------------------- catalogue


def catalogue() -> tuple[Entry, ...]:
    """Every entry of the report, tables first, in paper order."""
    return (*TABLES, *FIGURES)


#: The paper's numbered items that no entry reproduces, and why: each names what is missing (data, an
#: arm, a model, a GPU). With :func:`catalogue` it accounts for Tables 1–32 and Figures 1–11
#: (``tests/report/test_report.py`` checks it).
NOT_REPRODUCED: dict[str, str] = {
    "Figure 1": "a schematic of the method, not a measurement",
    "Table 11": "needs LongBench subtasks, which the collector does not generate (RULER-style tasks only)",
    "Table 15": "needs the scorer-independence arms (a geometry scorer and the two-key NIAH control), not logged",
    "Table 16": "needs SnapKV runs of two Llama-architecture models (GPU collection; none in the logs)",
    "Table 18": "needs a CapKV arm (a re-implementation in its own environment), not an evictor of the collector",
    "Table 19": "needs DBTrimKV's pretrained gates and environment, not an evictor of the collector",
    "Table 26": "end-to-end GPU timing, not a replay of logs (bench/gpu.py measures it when a GPU is lent)",
}


# --------------------------------------------------------------------------- writing


def _relative(path: str, out: Path) -> str:
    return os.path.relpath(path, out).replace(os.sep, "/")


@dataclass
class Outcome:
    """What happened to one entry: its output files, or the reason it was skipped."""

    name: str
    kind: str
    source: str
    caption: str
    files: list[str]
    skipped: str | None = None
    #: "model/context/task" cells among the table's rows whose full-KV answers the decode limit may have cut
    decode_limited: list[str] = dataclasses.field(default_factory=list)


def run_order(entries: Sequence[Entry]) -> list[int]:
    """The order the report runs ``entries`` in, as indices into them: those that never read the
    gated rows (``Entry.reads_gated`` False) first, then the others, each group in catalogue
    order. :attr:`Context.gated` is built on first use, so the first group runs without it (at 1M
    inputs, 9M rows and a gigabyte; docs/PERFORMANCE.md). The index lists the entries in catalogue
    order whatever the run order, and no entry's output depends on it."""
    return sorted(range(len(entries)), key=lambda i: entries[i].reads_gated)


def _skip_reason(entry: Entry, ctx: Context) -> str | None:
    for check in (needs_inputs, *entry.requires):
        reason = check(ctx)
        if reason:
            return reason
    return None


def _outcome(entry: Entry, ctx: Context, out: Path, formats: Sequence[str]) -> Outcome:
    """:func:`_run_entry`, an output without data recorded as the entry's skip reason."""
    try:
        return _run_entry(entry, ctx, out, formats)
    except _EmptyOutput as err:
        return Outcome(entry.name, entry.kind, entry.source, entry.caption, [], str(err))


def _run_entries(todo: list[Entry], ctx: Context, out: Path, formats: Sequence[str], bar, *,
                 resample: bool) -> dict[int, Outcome]:
    """Every entry's outcome, by index into ``todo``, run in :func:`run_order`, each entry with
    ``beside`` names on a second thread while the main thread runs those entries (it starts with the
    first of them and ends before any other starts), so that only the entries measured together share
    the process (:attr:`~pagestats.report.context.Entry.beside`). A failed entry fails the report
    once the entry running beside has ended; the entries waiting to run beside never start. ``resample``:
    start Table N3's resampling with the first entry that reads the gated rows."""
    names = {e.name: e for e in todo}
    for entry in todo:
        for name in entry.beside:
            if name in names and (names[name].reads_gated or names[name].beside):
                raise ValueError(f"entry {entry.name} runs beside {name}, which "
                                 + ("reads the gated rows" if names[name].reads_gated else "runs beside others itself"))
    waiting = {i for i, e in enumerate(todo) if any(n in names for n in e.beside)}
    running: dict[int, Future] = {}
    done: dict[int, Outcome] = {}
    pool = ThreadPoolExecutor(1, thread_name_prefix="pagestats-beside")
    try:
        for i in run_order(todo):
            entry = todo[i]
            if i in done or i in waiting or i in running:
                continue
            for j in [j for j in running if entry.name not in todo[j].beside]:  # it ends before this starts
                done[j] = running.pop(j).result()
                bar.update()
            for j in sorted(j for j in waiting if entry.name in todo[j].beside):
                waiting.remove(j)
                running[j] = pool.submit(_outcome, todo[j], ctx, out, formats)
            if entry.reads_gated and resample:  # Table N3's resampling runs beside these
                ctx.start_matched_memory()
            bar.set_postfix_str(entry.name)
            done[i] = _outcome(entry, ctx, out, formats)
            bar.update()
        for j, future in running.items():
            done[j] = future.result()
            bar.update()
    finally:
        pool.shutdown(cancel_futures=True)  # a failed report waits for the entry running beside
    return done


def _run_entry(entry: Entry, ctx: Context, out: Path, formats: Sequence[str] = FIGURE_FORMATS) -> Outcome:
    outcome = Outcome(entry.name, entry.kind, entry.source, entry.caption, [])
    reason = _skip_reason(entry, ctx)
    if reason:
        outcome.skipped = reason
        return outcome
    folder = out / ("figures" if entry.kind == "figure" else "tables")
    result = entry.make(ctx)
    parts = result if isinstance(result, list) else [("", result)]
    if not parts:
        outcome.skipped = "no cell has the data this item needs"
        return outcome
    write = _write_figure if entry.kind == "figure" else _write_table
    if entry.kind == "table":
        marks = {m for _, item in parts for m in ctx.decode_limited_in(_table_parts(item)[0])}
        outcome.decode_limited = sorted(marks)
    for part, item in parts:
        stem = folder / (f"{entry.name}-{_safe(part)}" if part else entry.name)
        outcome.files.extend(_relative(p, out) for p in write(item, stem, formats))
    return outcome


#: Bytes of a file-name part made from names in the logs; a longer part is cut and given a hash of
#: the whole (a name of any length from a manifest must still make a file name under 255 bytes).
MAX_PART_BYTES = 80


def _safe(part: str) -> str:
    """A file-name part from a label (model, context): letters, digits, ``-_.``; at most
    :data:`MAX_PART_BYTES` bytes, a longer one cut to 64 bytes plus 10 hex digits of its sha256."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(part))
    if len(safe.encode()) <= MAX_PART_BYTES:
        return safe
    digest = hashlib.sha256(str(part).encode()).hexdigest()[:10]
    return safe.encode()[:64].decode(errors="ignore") + "-" + digest


def _describe(value) -> dict | str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            fields[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
        return {"type": type(value).__name__, "name": getattr(value, "name", type(value).__name__), **fields}
    return repr(value)


def build_report(logs, out, *, policy=None, profile=None, entries: Sequence[Entry] | None = None,
                 formats: Sequence[str] = FIGURE_FORMATS, prereg=None,
                 dilution_rule: str | None = None, headline_evictor: str | None = None,
                 see_also: Sequence[tuple[str, str]] = ()) -> str:
    """Write every table and figure of the catalogue and the index; return the index path.

    The report is written to a temporary folder beside ``out`` and moved into place when
    complete (replacing a previous report there), so that a failure leaves no half-written
    report. Raises ``ValueError`` when ``out`` cannot receive a report
    (:func:`pagestats.core.targets.report_problem`); the parameters are those of
    :func:`_build_into`.
    """
    problem = report_problem(out, "out")
    if problem:
        raise ValueError(problem)
    with staged_directory(out) as staging, engine.checked_once_per_frame():  # no frame changes in place
        _build_into(logs, staging, policy=policy, profile=profile, entries=entries, formats=formats, prereg=prereg,
                    dilution_rule=dilution_rule, headline_evictor=headline_evictor, see_also=see_also)
    return str(Path(out) / "index.md")


def _build_into(logs, out, *, policy=None, profile=None, entries: Sequence[Entry] | None = None,
                formats: Sequence[str] = FIGURE_FORMATS, prereg=None, dilution_rule: str | None = None,
                headline_evictor: str | None = None, see_also: Sequence[tuple[str, str]] = ()) -> str:
    """Write every table and figure of the catalogue and the index into ``out``; return the index path.

    Parameters
    ----------
    logs : pagestats.io.Logs
        Loaded logs (``files`` is listed in the index with sha256 and rows).
    out : str or path
        Output directory (created).
    policy, profile
        Gate policy (default the fixed τ = 0.07) and profile spec (default: the logged D).
    entries : sequence of Entry, optional
        What to produce (default :func:`catalogue`).
    formats : sequence of str
        Figure file formats (default PNG and PDF).
    prereg : tuple, optional
        ``(meta, band)`` of a frozen band already verified by :func:`pagestats.io.prereg.verified_band`;
        Table 21 then checks it. Without it Table 21 is a post-hoc illustration.
    dilution_rule : str, optional
        Rows Fig. 9's slope is fitted on (:data:`pagestats.metrics.DILUTION_RULES`).
    headline_evictor : str, optional
        The evictor of the headline sentences and the single-evictor entries (default: snapkv
        when logged, else the first by name); one the logs lack raises
        :class:`~pagestats.report.context.HeadlineEvictorError`.
    see_also : sequence of (text, href)
        Links shown under the page's title (``make report`` links the report of the paper's own logs).

    Returns
    -------
    str
        Path of ``index.md`` (``index.json`` beside it holds the same content).

    Notes
    -----
    An entry whose requirement fails is skipped with its reason in the index; an entry
    that produces a figure without data or a table without rows is skipped likewise.
    Errors in the computation itself propagate.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(logs, policy=policy, profile=profile, prereg=prereg, dilution_rule=dilution_rule,
                  headline_evictor=headline_evictor)
    todo = list(catalogue() if entries is None else entries)
    with tqdm(total=len(todo), desc="report", unit="entry", file=sys.stderr, disable=None) as bar, \
            contextlib.closing(ctx):
        done = _run_entries(todo, ctx, out, formats, bar, resample=logs.outcomes.height > 0)
        lead = headline(ctx) if logs.outcomes.height else pl.DataFrame()  # reads Table N3's resampling
    outcomes = [done[i] for i in range(len(todo))]  # catalogue order
    marks = ctx.decode_limited.group_by("model", "context_length").agg(
        pl.col("task").unique().sort().str.join(", ").alias("decode_limited"))
    if lead.height:
        lead = lead.join(names_like(marks, lead), on=["model", "context_length"], how="left").with_columns(
            pl.col("decode_limited").fill_null(""))
    sentences = headline_sentences(lead, ctx.headline_evictor if logs.outcomes.height else None)
    sentences += [f"† At {r['context_length']} tokens ({r['model']}), the full-KV answers of {r['decode_limited']} "
                  "stopped at the decode limit without looping, or ended inside a reference: those tasks' numbers "
                  "measure the decode limit as well as eviction (pagestats validate lists them)."
                  for r in marks.sort("model", "context_length").iter_rows(named=True)]
    index = {
        "pagestats_version": pagestats.__version__,
        "see_also": [{"text": text, "href": href} for text, href in see_also],
        "schema_version": _schema_versions(logs),
        "files": [
            {"path": f.path, "table": f.table, "sha256": f.sha256, "rows": f.rows} for f in logs.files
        ],
        "runs": sorted(logs.manifests),
        "n_inputs": logs.inputs.height,
        "n_outcomes": logs.outcomes.height,
        "exclusions": list(logs.exclusions) + _control_lines(ctx) + _unknown_full_lines(ctx),
        "mode": logs.mode,  # the collection mode of every run (docs/SCHEMA.md)
        "policy": _describe(ctx.policy),
        "profile": _describe(ctx.profile),
        "headline_evictor": ctx.headline_evictor if logs.outcomes.height else None,
        "prereg": None if prereg is None else {k: v for k, v in prereg[0].items() if k != "files"},
        "pilots": _pilots(ctx),
        "dilution_rule": ctx.dilution_rule,
        "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.as_dict().items()},
        "decode_limited": ctx.decode_limited.to_dicts(),
        "outputs": [dataclasses.asdict(o) for o in outcomes],
        "not_reproduced": [{"source": k, "reason": v} for k, v in NOT_REPRODUCED.items()],
        "headline": lead.to_dicts(),
        "headline_sentences": sentences,
        # the paper's printed values beside ours (tables/conformance.csv; issue 40 §2)
        "conformance": conformance(ctx, out) if logs.outcomes.height else None,
    }
    (out / "index.json").write_text(json.dumps(index, indent=2, default=str) + "\n")
    path = out / "index.md"
    path.write_text(index_markdown(index, out))
    write_index_html(index, out)
    return str(path)


def _control_lines(ctx: Context) -> list[str]:
    """The control runs set apart from every entry but Table 31 (:func:`~pagestats.report.context.split_controls`)."""
    if ctx.controls is None:
        return []
    runs = ctx.controls.inputs.group_by("run_id").len().sort("run_id")
    return [f"set apart as a control run (uniform-random arm; read by Table 31 alone): {r} ({n} inputs)"
            for r, n in runs.iter_rows()]


def _unknown_full_lines(ctx: Context) -> list[str]:
    """The runs with unknown full-KV outcomes, set apart from every entry but the conformance table
    (:func:`~pagestats.report.context.split_incomplete`)."""
    if ctx.unknown_full is None:
        return []
    runs = ctx.unknown_full.inputs.group_by("run_id").agg(pl.len(), pl.col("full_score").null_count().alias("u"),
                                                          pl.col("drop").null_count().alias("d"))
    return [f"set apart: {r} ({n} inputs, " + (f"{d} without D: a RULER sweep, plain arm only; read by the "
            "conformance table's ρ)" if d else f"{u} without a full-KV outcome: the release has no b = 1 rows for "
            "them; the conformance table and `pagestats whatif` read it)") for r, n, u, d in runs.sort("run_id").iter_rows()]


def _pilots(ctx: Context) -> list[dict]:
    """The calibration pilots behind the report's numbers: the report policy's, and the reference
    z-scored pilot of Table N1 (App. A.3.4) — τ and inputs per task, per context and per run."""
    out = []
    for label, policy in (("report policy", ctx.policy), ("z-scored reference (Table N1)", ZScored())):
        try:
            comp = pilot_composition(ctx.logs, policy, ctx.profile)
        except ValueError as err:  # the pilot does not fit these logs: say so
            out.append({"pilot": label, "policy": policy.name, "unavailable": str(err)})
            continue
        if comp.height == 0:
            continue
        for (model,), part in comp.group_by(["model"], maintain_order=True):
            out.append({
                "pilot": label, "policy": policy.name, "model": model, "held_out": bool(part["held_out"].any()),
                "tau": sorted(set(part["tau"].to_list())), "n_inputs": int(part["n_pilot"].sum()),
                "tau_by_context_length": {str(c): sorted(set(g["tau"].to_list())) for (c,), g in  # the τ each gates
                                          part.sort("context_length").group_by(["context_length"], maintain_order=True)},
                **{f"by_{c}": {str(k): int(n) for k, n in part.group_by(c).agg(pl.col("n_pilot").sum()).sort(c).iter_rows()}
                   for c in ("task", "context_length", "run_id")},
            })
    return out


def _schema_versions(logs) -> list:
    manifests = logs.manifests
    return sorted({m.get("schema_version") for m in manifests.values() if isinstance(m, dict)} - {None})
