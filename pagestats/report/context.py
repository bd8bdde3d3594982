"""What a report entry is and what it sees: the :class:`Context` (the logs, the policy,
the profile and the replays computed once from them), the :data:`Requirement` checks
(``needs_*``: ``None`` when the data suffice, else a one-line skip reason) and the
:class:`Entry` record (docs/CLI.md ``pagestats report``). Public so that users can write their
own entries and pass them to :func:`pagestats.report.build_report`.
"""

from __future__ import annotations

import dataclasses

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults, formulas
from pagestats.io.decoding import decode_profile, flagged_tasks
from pagestats.io.logs import categorical_names
from pagestats.core.columns import headline_evictor, names_like, with_task_class
from pagestats.core.schema import INPUT_KEY
from pagestats.replay import FixedTau, ProfileSpec

#: A requirement: ``None`` when the context satisfies it, else the one-line skip reason.
Requirement = Callable[["Context"], "str | None"]


# --------------------------------------------------------------------------- context


class HeadlineEvictorError(ValueError):
    """The headline evictor asked for is not an evictor of the logs (``evictor``; ``logged``: those they hold)."""

    def __init__(self, evictor: str, logged: list[str]):
        self.evictor, self.logged = evictor, logged
        super().__init__(f"headline evictor {evictor!r} is not logged; the logs hold {', '.join(logged) or 'no evictor'}")


class Context:
    """What every entry of a report sees: the logs, the policy, the profile, and the
    replays computed once (lazily) from them."""

    def __init__(self, logs, *, policy=None, profile=None, prereg=None, dilution_rule=None, headline_evictor=None):
        logs = categorical_names(logs)
        #: the control runs (a :data:`~pagestats.core.defaults.CONTROL_EVICTORS` arm): Table 31 reads these alone
        logs, self.controls = split_controls(logs)
        #: every run, those with unknown full-KV outcomes included: the conformance table reads these
        self.every_run = logs
        #: runs some of whose inputs have no full-KV outcome (an imported file without b = 1 rows) or no D
        #: (an imported RULER sweep), docs/IMPORT.md: set apart, since almost every entry reads both
        logs, self.unknown_full = split_incomplete(logs)
        #: every input draw of the other runs: Table 30 (seed replicates) reads these
        self.all_logs = logs
        #: the first input draw of each (model, context): every other entry reads these, so that a
        #: cell has one input set across the report (docs/decisions.md, "One input set per cell")
        self.logs = first_draw(logs)
        self.policy = policy if policy is not None else FixedTau()
        self.profile = profile if profile is not None else ProfileSpec()
        #: ``(meta, band)`` of a verified frozen band (:func:`pagestats.io.prereg.verified_band`), or None
        self.prereg = prereg
        #: rows the scaling slope of Fig. 9 is fitted on (:data:`pagestats.metrics.DILUTION_RULES`)
        self.dilution_rule = dilution_rule or defaults.DILUTION_RULE
        logged = sorted(set(self.logs.outcomes["evictor"].to_list()))
        if headline_evictor is not None and headline_evictor not in logged:
            raise HeadlineEvictorError(headline_evictor, logged)
        self._headline_evictor = headline_evictor
        self._matched: Future | None = None  # start_matched_memory
        self._stop = threading.Event()

    @functools.cached_property
    def gate(self) -> pl.DataFrame:
        return replay.gate(self.logs, self.policy, self.profile)

    @functools.cached_property
    def gated(self) -> pl.DataFrame:
        return replay.gated_outcomes(self.logs, self.policy, self.profile)

    def midpoint_outcomes(self) -> tuple[pl.DataFrame | None, pl.DataFrame]:
        """``(gated outcomes of the headline evictor at the paper's midpoint τ, the cells without its
        sample)`` (Eq. 5; :meth:`pagestats.replay.Midpoint.applicable`), for Tables 20 and 29; the
        outcomes are ``None`` when no cell holds the sample. Computed on each call, not kept: the
        report would otherwise hold them through every later entry (0.5 GiB at 1M inputs)."""
        mid = replay.Midpoint()
        logs, short = mid.applicable(self.logs)
        if logs.inputs.height == 0:
            return None, short
        return replay.gated_outcomes(logs, mid, self.profile, evictor=self.headline_evictor,
                                     columns=replay.DELTA_COLUMNS), short

    @functools.cached_property
    def control_outcomes(self) -> pl.DataFrame:
        """The control runs' outcomes with their full-KV scores (Table 31 reads only the plain and
        full-KV arms, which no gate policy changes: the fixed τ decides the unused gated arm)."""
        return replay.gated_outcomes(self.controls, FixedTau(), self.profile)

    @functools.cached_property
    def headline_evictor(self) -> str:
        """The evictor of the headline sentences and the single-evictor figures and tables: the one
        asked for, else snapkv (as in the paper) when logged, else the first in name order."""
        if self._headline_evictor is not None:
            return self._headline_evictor
        return headline_evictor(self.logs.outcomes["evictor"].unique().to_list())

    @property
    def fixed_tau(self) -> float | None:
        """τ of a fixed-threshold policy, else None."""
        return self.policy.fixed_tau

    @functools.cached_property
    def matched_memory(self) -> pl.DataFrame:
        """Δ at matched memory per (model, context, evictor) (:func:`pagestats.metrics.matched_memory`),
        the evictors of a (model, context) on the same inputs as Table 28, with Table 28's seed;
        the resampling started by :meth:`start_matched_memory` when it was called."""
        if self._matched is None:
            return self._matched_memory_later()()
        return self._matched.result()

    def _matched_memory_later(self) -> Callable[..., pl.DataFrame]:
        """:attr:`matched_memory` in two steps: the gated rows are read and checked now
        (:func:`pagestats.metrics.matched_cells`); the function returned resamples them."""
        rows, _ = metrics.equal_inputs(self.gated, by=["model", "context_length"])
        by = ["model", "context_length", "evictor"]
        both = (rows.group_by(by).agg((pl.col("budget") == 1.0).any().alias("full"),
                                      formulas.EVICTED.any().alias("evicted"))
                .filter(pl.col("full") & pl.col("evicted")).select(by))
        if both.height == 0:
            empty = pl.DataFrame(schema={**rows.select(by).schema, "n_inputs": pl.Int64,
                                         **{c: pl.Float64 for c in ("kept_kv_gated", "acc_gated", "acc_plain_matched",
                                                                    "delta_matched", "low", "high", "delta_nominal",
                                                                    "p_value", "p_adjusted")}})
            return lambda stop=None: empty
        if both.height != rows.select(by).n_unique():  # else every cell: no copy
            rows = rows.join(both, on=by, how="semi")
        cells, like = metrics.matched_cells(metrics.relation(rows), by=by), rows.select(by).clear()
        return lambda stop=None: names_like(cells.resample(rng=np.random.default_rng(defaults.BOOTSTRAP_SEED),
                                                           stop=stop), like)

    def start_matched_memory(self) -> None:
        """Read :attr:`matched_memory`'s rows now and resample them on a second thread, beside the
        entries that follow (its 10,000 resamples are NumPy's alone, about two minutes at 1M inputs,
        while the replays wait on DuckDB). The report calls this once, when it builds the gated
        rows; the numbers are those of the one-thread call (the same generator, drawn in the same
        order). An error in reading the rows is raised here; one in the resampling where
        :attr:`matched_memory` is read. :meth:`close` stops the resampling."""
        if self._matched is not None or "matched_memory" in self.__dict__:
            return
        resample = self._matched_memory_later()
        pool = ThreadPoolExecutor(1, thread_name_prefix="pagestats-matched-memory")
        self._matched = pool.submit(resample, self._stop)
        pool.shutdown(wait=False)  # the thread ends with its one task

    def close(self) -> None:
        """Stop a resampling :meth:`start_matched_memory` started and not yet read (a report that failed)."""
        self._stop.set()

    @functools.cached_property
    def decode_limited(self) -> pl.DataFrame:
        """(model, context_length, task, run) of every (run, task) whose full-KV answers the decode limit
        may have cut (:func:`pagestats.io.decoding.flagged_tasks`), read from the logs' files; empty
        when the logs hold no files (built in memory: nothing to read the text from)."""
        empty = pl.DataFrame(schema={"model": pl.String, "context_length": pl.Int64, "task": pl.String,
                                     "run": pl.String})
        files = [f for f in self.logs.files if f.table == "inputs"]
        if not files:
            return empty
        flagged = flagged_tasks(decode_profile(files, arms=False))
        cells = self.logs.inputs.select("run_id", "model", "context_length").unique().cast(
            {"run_id": pl.String, "model": pl.String})  # the flags' text, as the empty frame's
        return (flagged.join(cells, on="run_id").select("model", "context_length", "task", "run")
                .unique().sort("model", "context_length", "task", "run")) if flagged.height else empty

    def decode_limited_in(self, frame: pl.DataFrame) -> list[str]:
        """The flagged (model, context, task) of :attr:`decode_limited` that ``frame``'s rows draw on, as
        ``"model/context/task"``: matched on whichever of model, context_length and task the frame has
        (a frame with none of them pools every input, so every flagged cell)."""
        marks = self.decode_limited
        if marks.height == 0:
            return []
        keys = [c for c in ("model", "context_length", "task") if c in frame.columns]
        if keys:
            try:
                present = frame.select(keys).unique().cast({k: marks.schema[k] for k in keys})
            except pl.exceptions.InvalidOperationError:  # a column of that name holding other values
                present = None
            if present is not None:
                marks = marks.join(present, on=keys, how="semi")
        return [f"{r['model']}/{r['context_length']}/{r['task']}" for r in marks.unique(
            ["model", "context_length", "task"]).sort("model", "context_length", "task").iter_rows(named=True)]

    @functools.cached_property
    def context_lengths(self) -> list[int]:
        return sorted(self.logs.inputs["context_length"].unique().to_list())

    @functools.cached_property
    def task_classes(self) -> list[str]:
        return sorted(with_task_class(self.logs.inputs)["task_class"].unique().drop_nulls().to_list())


def split_controls(logs):
    """``(logs without the control runs, the control runs)``: a run that logs a control arm
    (:data:`pagestats.core.defaults.CONTROL_EVICTORS`, Table 31's uniform-random scoring) repeats inputs
    of the main runs to compare an informed scorer with the control, so its inputs and outcomes are
    kept out of every other entry (docs/decisions.md, "Control runs"). The second item is ``None``
    when there are none (and the first is ``logs`` itself)."""
    return split_runs(logs, logs.outcomes.filter(pl.col("evictor").is_in(list(defaults.CONTROL_EVICTORS)))["run_id"])


def split_runs(logs, runs: pl.Series):
    """``(logs without the runs ``runs``, those runs)``; ``(logs, None)`` when ``runs`` is empty."""
    runs = runs.unique()
    if runs.len() == 0:
        return logs, None

    def part(frame, keep: bool):
        return None if frame is None else frame.filter(pl.col("run_id").is_in(runs.implode()) == keep)

    return tuple(dataclasses.replace(logs, inputs=part(logs.inputs, keep), outcomes=part(logs.outcomes, keep),
                                     topk=part(logs.topk, keep)) for keep in (False, True))


def split_incomplete(logs):
    """``(logs without the runs that lack some full-KV outcome or some D, those runs)``: in an imported
    file without b = 1 rows the full-KV outcome of a gate-open input is unknown, and an imported RULER
    sweep has no D (docs/IMPORT.md), so the harm, ρ, A_full, frontier and gate entries cannot be
    computed on such a run; the conformance table reads it (``pagestats whatif`` too, where it can).
    The second item is ``None`` when every run is complete."""
    return split_runs(logs, logs.inputs.filter(pl.col("full_score").is_null() | pl.col("drop").is_null())["run_id"])


def first_draw(logs):
    """``logs`` restricted to one input ``draw`` of each (model, context_length): the lowest draw
    with eviction outcomes (budget b < 1), or the lowest draw where no draw has any (a full-KV-only
    draw, such as a pre-registration's target run, is not the cell's input set when an evicted draw
    exists). The other draws' inputs, their outcomes and top-k rows are left out (the same object
    when there are none)."""
    inputs = logs.inputs
    if "draw" not in inputs.columns or inputs.height == 0:
        return logs
    evicted = (logs.outcomes.lazy().filter(formulas.EVICTED).select(INPUT_KEY).unique()  # lazy: only the key is read
               .with_columns(pl.lit(True).alias("_evicted")).collect())
    rank = (inputs.join(evicted, on=list(INPUT_KEY), how="left")
            .group_by("model", "context_length", "draw").agg(pl.col("_evicted").any().fill_null(False))
            .sort("model", "context_length", ~pl.col("_evicted"), "draw")
            .group_by("model", "context_length", maintain_order=True).first().select("model", "context_length", "draw"))
    kept = inputs.join(rank, on=["model", "context_length", "draw"], how="semi")
    if kept.height == inputs.height:
        return logs
    key = list(INPUT_KEY)
    keys = kept.select(key)
    return dataclasses.replace(
        logs, inputs=kept, outcomes=logs.outcomes.join(keys, on=key, how="semi"),
        topk=None if logs.topk is None else logs.topk.join(keys, on=key, how="semi"))


# --------------------------------------------------------------------------- requirements


def needs_controls(ctx: Context) -> str | None:
    """Table 31 needs a control run: SnapKV beside the uniform-random arm on the same inputs."""
    if ctx.controls is None:
        return ("needs a uniform-random scoring arm beside SnapKV (pagestats-collect --evictors snapkv,random), "
                "which the logs do not hold")
    evictors = set(ctx.controls.outcomes["evictor"].unique().to_list())
    if "snapkv" not in evictors:
        return "the control run logs no SnapKV arm to compare the uniform-random arm with"
    return None


def needs_inputs(ctx: Context) -> str | None:
    """Every entry needs at least one input (checked before an entry's own requirements)."""
    if ctx.logs.inputs.height == 0:
        return "the logs have no inputs (after exclusions)"
    return None


def needs_signals(ctx: Context) -> str | None:
    """Every logged ``signals`` field present and finite for every input (the column itself
    is optional: without it the entry uses the profile statistics only)."""
    inputs = ctx.logs.inputs
    if "signals" not in inputs.columns or not isinstance(inputs.schema["signals"], pl.Struct):
        return None
    for f in inputs.schema["signals"].fields:
        value = pl.col("signals").struct.field(f.name)
        bad = inputs.select((value.is_null() | ~value.cast(pl.Float64).is_finite()).sum()).item()  # null → counted
        if bad:
            return f"signal {f.name!r} is missing or not finite for {bad} of {inputs.height} inputs"
    return None


def needs_pilot_groups(ctx: Context) -> str | None:
    """The z-scored gate's pilot needs ≥ 2 inputs per (model, context_length) for σ (App. A.3.4)."""
    sizes = ctx.logs.inputs.group_by("model", "context_length").len()
    small = sizes.filter(pl.col("len") < 2)
    if small.height:
        model, ctx_len, n = small.sort("model", "context_length").row(0)
        return (f"the z-scored pilot needs ≥ 2 inputs per (model, context_length); {model} at {ctx_len} has {n}")
    return None


def needs_cache_size(ctx: Context) -> str | None:
    """Every run has a manifest whose ``model`` entry gives the KV bytes per token, and the runs of
    one (model, context_length) agree on it (the GiB axis of the decision figure,
    :func:`pagestats.metrics.full_cache_gib`)."""
    manifests = ctx.logs.manifests
    for run_id in sorted(ctx.logs.inputs["run_id"].unique().to_list()):
        if run_id not in manifests:
            return f"run {run_id!r} has no manifest, so its KV cache size is unknown"
        try:
            metrics.kv_bytes_per_token(manifests[run_id].get("model") or {})
        except ValueError as err:
            return f"run {run_id!r}: {err}"
    try:
        metrics.full_cache_gib(ctx.logs.inputs, manifests)
    except ValueError as err:
        return str(err)
    return None


def needs_full_budget(ctx: Context) -> str | None:
    """Some (model, context, evictor) cell logs budget 1.0 (the full cache) beside budgets b < 1: the
    frontier of Δ at matched memory starts at the full cache (:func:`pagestats.metrics.matched_memory`).
    Cells without it are left out of Table N3 and of the headline's matched-memory clause."""
    if ctx.matched_memory.height == 0:
        return "needs budget 1.0 (the full cache) beside budgets b < 1 in one cell; no cell logs both"
    return None


def needs_eviction_budgets(ctx: Context) -> str | None:
    if ctx.logs.outcomes.filter(formulas.EVICTED).height == 0:
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
    missing = inputs["agreement"].null_count()
    if missing:
        return (f"{missing} of {inputs.height} inputs have no per-layer agreement profile (runs imported from a "
                "release that has none for them: manifest imported.unsupported)")
    if inputs.select(pl.col("agreement").list.len().min()).item() < 2:
        return "per-layer agreement profiles have fewer than 2 layers"
    return None


def needs_topk(ctx: Context) -> str | None:
    topk = ctx.logs.topk
    if topk is None or topk.height == 0:
        return "no topk table in the logs (collect with stored top-k indices)"
    return None


def needs_draws(n: int) -> Requirement:
    def check(ctx: Context) -> str | None:
        got = ctx.all_logs.inputs["draw"].n_unique() if "draw" in ctx.all_logs.inputs.columns else 0
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
    #: whether ``make`` or ``requires`` read :attr:`Context.gated` (or :attr:`Context.matched_memory`,
    #: made from it). The report runs the entries that do not first, before those rows are built, so
    #: that its heaviest replays (Tables 7 and N1, Fig. 6) never share the memory with them
    #: (:func:`pagestats.report.build.run_order`). Leave it True unless the entry never reads them:
    #: the order only changes which entries run beside the rows, never a number.
    reads_gated: bool = True
    #: the entries (by name) this one runs beside: the report runs ``make`` on a second thread while
    #: its main thread runs them, from the first of them on, and waits for it before any other
    #: (:func:`pagestats.report.build_report`); without them among the report's entries it runs in its
    #: place. For a long table that waits on one DuckDB thread: Table N1 beside Tables 9 and 10 (at 1M
    #: inputs about 110, 85 and 25 s alone; N1 1.25 GiB and Table 9 1.05 GiB above the loaded logs; the
    #: pairs measured, and those that would pass 4 GiB, in docs/PERFORMANCE.md). The numbers are those of one
    #: thread: each replay has a connection of its own, on one thread. A figure cannot run beside
    #: others (pyplot is one per process), nor an entry that reads the gated rows, nor beside one.
    beside: tuple[str, ...] = ()

    def __post_init__(self):
        if self.beside and (self.kind != "table" or self.reads_gated):
            raise ValueError(f"entry {self.name}: only a table that does not read the gated rows runs beside others")
