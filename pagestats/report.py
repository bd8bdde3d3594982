"""The report: every table and figure of the catalogue, plus an index of what it was
computed from (DESIGN §5 ``pagestats report``, §9 "every report states which files").

The report is only a list of calls. :data:`FIGURES` (and the table entries of
:mod:`pagestats.tables`, when that module is installed) are :class:`Entry` values: a
name, the paper item it reproduces, a function of a :class:`Context`, and the data it
requires. An entry whose requirement fails is *skipped* with a one-line reason written
to the index — never an exception, never an empty figure. Every replay is computed once
per report (the :class:`Context` caches the gate decisions and gated outcomes).

Outputs under ``out``: ``figures/<name>[-<part>].png|pdf``, ``tables/<name>.csv|md``
(``.html`` where the table is typeset with great_tables), ``index.md`` and
``index.json`` (log files with sha256 and rows, exclusions, the policy, profile and
defaults used, every output and every skip reason).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats._outputs import (  # noqa: F401  (markdown_table is public here too)
    FIGURE_FORMATS,
    _EmptyOutput,
    _write_figure,
    _write_table,
    markdown_table,
)

#: A requirement: ``None`` when the context satisfies it, else the one-line skip reason.
Requirement = Callable[["Context"], "str | None"]


# --------------------------------------------------------------------------- context


class Context:
    """What every entry of a report sees: the logs, the policy, the profile, and the
    replays computed once (lazily) from them."""

    def __init__(self, logs, *, policy=None, profile=None):
        from pagestats.policies import FixedTau
        from pagestats.replay import ProfileSpec

        self.logs = logs
        self.policy = policy if policy is not None else FixedTau()
        self.profile = profile if profile is not None else ProfileSpec()

    @functools.cached_property
    def gate(self) -> pl.DataFrame:
        from pagestats import replay

        return replay.gate(self.logs, self.policy, self.profile)

    @functools.cached_property
    def gated(self) -> pl.DataFrame:
        from pagestats import replay

        return replay.gated_outcomes(self.logs, self.policy, self.profile)

    @functools.cached_property
    def headline_evictor(self) -> str:
        """The evictor of the single-evictor figures: snapkv (as in the paper) when logged,
        else the first in name order."""
        evictors = sorted(self.logs.outcomes["evictor"].unique().to_list())
        return "snapkv" if "snapkv" in evictors else evictors[0]

    @property
    def fixed_tau(self) -> float | None:
        """τ of a fixed-threshold policy, else None."""
        return getattr(self.policy, "tau", None) if type(self.policy).__name__ == "FixedTau" else None

    @functools.cached_property
    def context_lengths(self) -> list[int]:
        return sorted(self.logs.inputs["context_length"].unique().to_list())

    @functools.cached_property
    def task_classes(self) -> list[str]:
        inputs = self.logs.inputs
        if "task_class" in inputs.columns:
            return sorted(inputs["task_class"].unique().drop_nulls().to_list())
        return sorted({defaults.default_task_class(t) for t in inputs["task"].unique().to_list()})


# --------------------------------------------------------------------------- requirements


def needs_eviction_budgets(ctx: Context) -> str | None:
    if ctx.logs.outcomes.filter(pl.col("budget") < 1.0).height == 0:
        return "no eviction budgets b < 1 in the outcomes"
    return None


def needs_both_classes(ctx: Context) -> str | None:
    missing = {defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE} - set(ctx.task_classes)
    if missing:
        return f"needs both task classes; no {', '.join(sorted(missing))} task in the logs"
    return None


def needs_contexts(n: int) -> Requirement:
    def check(ctx: Context) -> str | None:
        got = len(ctx.context_lengths)
        if got < n:
            return f"needs ≥{n} context lengths; the logs have {got} ({', '.join(map(str, ctx.context_lengths))})"
        return None

    check.__name__ = f"needs_contexts_{n}"
    return check


def needs_agreement(ctx: Context) -> str | None:
    inputs = ctx.logs.inputs
    if "agreement" not in inputs.columns:
        return "no per-layer agreement profiles in the inputs"
    if inputs.select(pl.col("agreement").list.len().min()).item() < 2:
        return "per-layer agreement profiles have fewer than 2 layers"
    return None


def needs_topk(ctx: Context) -> str | None:
    topk = getattr(ctx.logs, "topk", None)
    if topk is None or topk.height == 0:
        return "no topk table in the logs (collect with stored top-k indices)"
    return None


def needs_draws(n: int) -> Requirement:
    def check(ctx: Context) -> str | None:
        got = ctx.logs.inputs["draw"].n_unique() if "draw" in ctx.logs.inputs.columns else 0
        if got < n:
            return f"needs ≥{n} input draws (seed replicates); the logs have {got}"
        return None

    check.__name__ = f"needs_draws_{n}"
    return check


def needs_dilution_headroom(ctx: Context) -> str | None:
    inputs = ctx.logs.inputs
    dil = ctx.gate.filter(pl.col("task_class") == defaults.DILUTION_PRONE)
    if dil.height == 0:
        return "no dilution-prone inputs to fit the scaling slope on"
    if float(dil["full_score"].min()) >= 1.0 and inputs.height:
        return "every dilution-prone input has full-KV accuracy 1 (no headroom to fit)"
    return None


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """One report item: ``make(ctx)`` returns a Figure/Axes, a table (polars frame or
    great_tables GT), or a list of ``(part, item)`` for several outputs."""

    name: str
    kind: str  # "figure" | "table"
    source: str  # the paper item, e.g. "Figure 2"
    make: Callable[[Context], object]
    requires: tuple[Requirement, ...] = ()
    caption: str = ""


def _per_cell(ctx: Context, frame: pl.DataFrame, keys: Sequence[str], draw) -> list[tuple[str, object]]:
    from pagestats.figures._style import cell_label

    parts = []
    for cell in frame.select(keys).unique().sort(keys).to_dicts():
        part = cell_label(cell).replace(" ", "-")
        parts.append((part, draw(cell)))
    return parts


def _fig2(ctx):
    from pagestats.figures import drop_by_task

    return drop_by_task(ctx.gate, tau=ctx.fixed_tau)


def _fig3(ctx):
    from pagestats.figures import accuracy_vs_budget

    ev = ctx.headline_evictor
    sub = ctx.gated.filter(pl.col("evictor") == ev)
    return _per_cell(ctx, sub, ["model", "context_length"],
                     lambda c: accuracy_vs_budget(sub, model=c["model"], context_length=c["context_length"], evictor=ev))


def _fig4(ctx):
    from pagestats.figures import accuracy_vs_kept_kv

    ev = ctx.headline_evictor
    sub = ctx.gated.filter(pl.col("evictor") == ev)
    return _per_cell(ctx, sub, ["context_length"],
                     lambda c: accuracy_vs_kept_kv(sub, evictor=ev, context_length=c["context_length"]).figure)


def _fig5(ctx):
    from pagestats.figures import agreement_profile

    return agreement_profile(ctx.logs.inputs, bin_fraction=ctx.profile.bin_fraction,
                             convention=ctx.profile.convention)


#: Thresholds of the τ-sensitivity curve (Fig. 6); the deployed τ is added.
TAU_GRID = np.round(np.arange(-0.05, 0.2501, 0.0025), 6)


def _fig6(ctx):
    from pagestats import replay
    from pagestats.figures import tau_sensitivity

    tau0 = ctx.fixed_tau if ctx.fixed_tau is not None else defaults.TAU
    taus = np.unique(np.r_[TAU_GRID, tau0])
    curve = replay.tau_curve(ctx.logs, taus, ctx.profile, by=("model", "context_length", "evictor"))
    curve = curve.filter(pl.col("evictor") == ctx.headline_evictor)
    return tau_sensitivity(curve, tau0=tau0)


def _fig7(ctx):
    from pagestats.figures import delta_of_f

    return delta_of_f(ctx.gated).figure


def _fig8(ctx):
    from pagestats.figures import delta_matrix

    return delta_matrix(ctx.gated).figure


def _fig9(ctx):
    from pagestats.figures import rho_vs_headroom

    return rho_vs_headroom(ctx.gated.filter(pl.col("evictor") == ctx.headline_evictor)).figure


def _fig10(ctx):
    from pagestats.figures import recovery_distribution

    return recovery_distribution(ctx.gated.filter(pl.col("evictor") == ctx.headline_evictor))


def _fig11(ctx):
    from pagestats.figures import recovery_fraction

    return recovery_fraction(ctx.gated.filter(pl.col("evictor") == ctx.headline_evictor))


FIGURES: tuple[Entry, ...] = (
    Entry("fig02_drop_by_task", "figure", "Figure 2", _fig2, (),
          "D per input by task; bars are per-task means; dashed line the fixed τ."),
    Entry("fig03_accuracy_vs_budget", "figure", "Figure 3", _fig3, (needs_eviction_budgets,),
          "Accuracy vs nominal KV budget, plain (solid) and gated (dashed), per task; one file per "
          "(model, context), headline evictor."),
    Entry("fig04_accuracy_vs_kept_kv", "figure", "Figure 4", _fig4, (needs_eviction_budgets,),
          "Accuracy vs achieved kept-KV fraction with the frontier; one file per context, headline evictor."),
    Entry("fig05_agreement_profile", "figure", "Figure 5", _fig5, (needs_agreement,),
          "Per-layer agreement a_ℓ averaged over inputs per task; shaded early/late bins."),
    Entry("fig06_tau_sensitivity", "figure", "Figure 6", _fig6, (needs_eviction_budgets, needs_both_classes),
          "Δ, FP and FN rates vs τ; shaded plateau |Δ − Δ_τ0| ≤ 1 pp and FP + FN ≤ 0.10; headline evictor."),
    Entry("fig07_delta_of_f", "figure", "Figure 7", _fig7, (needs_eviction_budgets, needs_both_classes),
          "Δ(f) = f·Δ_capacity + (1 − f)·Δ_rest per matrix cell (grey) and their mean."),
    Entry("fig08_delta_matrix", "figure", "Figure 8", _fig8, (needs_eviction_budgets,),
          "Δ (gated − plain, budgets b < 1) per (model, context) × evictor cell."),
    Entry("fig09_rho_vs_headroom", "figure", "Figure 9", _fig9,
          (needs_eviction_budgets, needs_contexts(2), needs_dilution_headroom),
          "ρ vs headroom 1 − A_full per (model, context, task) with the through-origin slope; headline evictor."),
    Entry("fig10_recovery_distribution", "figure", "Figure 10", _fig10, (needs_eviction_budgets,),
          "Distribution of r(x) per task, pooled over cells; headline evictor."),
    Entry("fig11_recovery_fraction", "figure", "Figure 11", _fig11, (needs_eviction_budgets,),
          "Share of inputs with r(x) > 0 per task and (model, context) cell, Wilson 95% bars; headline evictor."),
)


def table_entries() -> tuple[Entry, ...]:
    """The table entries of :mod:`pagestats.tables`: its ``TABLES`` registry of
    :class:`Entry` values when it has one; empty when the module is not installed."""
    try:
        from pagestats import tables
    except ImportError:
        return ()
    registry = getattr(tables, "TABLES", None)
    if registry is None:
        return ()
    return tuple(registry)


def catalogue() -> tuple[Entry, ...]:
    """Every entry of the report, tables first, in paper order."""
    return (*table_entries(), *FIGURES)


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


def _skip_reason(entry: Entry, ctx: Context) -> str | None:
    for check in entry.requires:
        reason = check(ctx)
        if reason:
            return reason
    return None


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
    for part, item in parts:
        stem = folder / (f"{entry.name}-{_safe(part)}" if part else entry.name)
        outcome.files.extend(_relative(p, out) for p in write(item, stem, formats))
    return outcome


def _safe(part: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(part))


def _describe(value) -> dict | str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            fields[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
        return {"type": type(value).__name__, "name": getattr(value, "name", type(value).__name__), **fields}
    return repr(value)


def build_report(logs, out, *, policy=None, profile=None, entries: Sequence[Entry] | None = None,
                 formats: Sequence[str] = FIGURE_FORMATS) -> str:
    """Write every table and figure of the catalogue and the index; return the index path.

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
    import pagestats

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(logs, policy=policy, profile=profile)
    outcomes = []
    for entry in catalogue() if entries is None else entries:
        try:
            outcomes.append(_run_entry(entry, ctx, out, formats))
        except _EmptyOutput as err:
            outcomes.append(Outcome(entry.name, entry.kind, entry.source, entry.caption, [], str(err)))
    index = {
        "pagestats_version": pagestats.__version__,
        "schema_version": _schema_versions(logs),
        "files": [
            {"path": f.path, "table": f.table, "sha256": f.sha256, "rows": f.rows} for f in getattr(logs, "files", [])
        ],
        "runs": sorted(getattr(logs, "manifests", {}) or {}),
        "n_inputs": logs.inputs.height,
        "n_outcomes": logs.outcomes.height,
        "exclusions": list(getattr(logs, "exclusions", []) or []),
        "policy": _describe(ctx.policy),
        "profile": _describe(ctx.profile),
        "headline_evictor": ctx.headline_evictor,
        "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.as_dict().items()},
        "outputs": [dataclasses.asdict(o) for o in outcomes],
    }
    (out / "index.json").write_text(json.dumps(index, indent=2, default=str) + "\n")
    path = out / "index.md"
    path.write_text(_index_markdown(index))
    return str(path)


def _schema_versions(logs) -> list:
    manifests = getattr(logs, "manifests", {}) or {}
    return sorted({m.get("schema_version") for m in manifests.values() if isinstance(m, dict)} - {None})


def _index_markdown(index: dict) -> str:
    lines = ["# pagestats report", ""]
    lines.append(f"pagestats {index['pagestats_version']}; log schema {index['schema_version'] or '?'}; "
                 f"{index['n_inputs']} inputs, {index['n_outcomes']} outcome rows, "
                 f"{len(index['runs'])} run(s); headline evictor `{index['headline_evictor']}`.")
    lines += ["", "## Log files", ""]
    if index["files"]:
        lines.append(markdown_table(pl.DataFrame(index["files"], schema={
            "path": pl.String, "table": pl.String, "sha256": pl.String, "rows": pl.Int64})).rstrip())
    else:
        lines.append("(the logs were not read from files: no hashes to report)")
    lines += ["", "## Exclusions", ""]
    lines += [f"- {e}" for e in index["exclusions"]] or ["none"]
    lines += ["", "## Policy and profile", ""]
    lines.append(f"- policy: `{json.dumps(index['policy'], default=str)}`")
    lines.append(f"- profile: `{json.dumps(index['profile'], default=str)}`")
    lines += ["", "## Defaults (pagestats.defaults)", ""]
    lines += [f"- {k} = {v}" for k, v in index["defaults"].items()]
    lines += ["", "## Outputs", ""]
    for o in index["outputs"]:
        if o["skipped"]:
            lines.append(f"- **{o['source']}** `{o['name']}` — SKIPPED: {o['skipped']}")
        else:
            links = ", ".join(f"[{Path(f).name}]({f})" for f in o["files"])
            lines.append(f"- **{o['source']}** `{o['name']}` — {o['caption']} {links}".rstrip())
    return "\n".join(lines) + "\n"

