"""The containers of loaded logs and the one protocol they share: :class:`LogTables` (what every
stage reads of logs), :class:`Logs` (the tables of :func:`pagestats.io.load` as polars frames, with
the manifests, the files read and what was left out; :class:`pagestats.io.LogDB` is the other, views
over the files) and :class:`FileRecord` (one file read, with its sha256); :data:`HEAVY_COLUMNS`, the
text columns ``columns="analysis"`` leaves out; :func:`categorical_names`, the logs with their name
columns as categoricals (the report's memory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import duckdb
import polars as pl

from pagestats.core import defaults
from pagestats.core.columns import names_like, repeats_a_key, require_columns, rows_where, with_task_class
from pagestats.io import duck
from pagestats.io.validation.problems import Problem
from pagestats.core.schema import INPUT_KEY

#: Text columns left out by ``columns="analysis"`` (they can be huge).
HEAVY_COLUMNS = ("prompt", "full_prediction", "prediction", "references")

#: The scalar columns of ``inputs`` the replay reads (:class:`pagestats.replay.Replay`).
INPUT_COLUMNS = (*INPUT_KEY, "model", "context_length", "task_class", "n_tokens", "full_score", "drop")
#: The columns of ``outcomes`` the replay reads.
OUTCOME_COLUMNS = (*INPUT_KEY, "evictor", "budget", "n_kept", "score")

#: The columns of names (run, model, task, task class, evictor, stop reasons) that
#: :func:`categorical_names` holds as :class:`polars.Categorical`.
NAME_COLUMNS = ("run_id", "model", "task", "task_class", "evictor", "stop_reason", "full_stop_reason")


def categorical_frame(frame: pl.DataFrame | None) -> pl.DataFrame | None:
    """``frame`` with its text columns of :data:`NAME_COLUMNS` cast to :class:`polars.Categorical`
    (the same object when it has none; ``None`` stays ``None``)."""
    if frame is None:
        return None
    names = {c: pl.Categorical for c in NAME_COLUMNS if frame.schema.get(c) == pl.String}
    return frame.cast(names) if names else frame


def categorical_names(logs):
    """``logs`` with the name columns (:data:`NAME_COLUMNS`) of its inputs, outcomes and top-k
    tables held as :class:`polars.Categorical` (:func:`categorical_frame`); the same object when
    none is text.

    The report holds every outcome row and its gated copy for the whole run. At 1M inputs (9M
    outcome rows) one column of 9M short names takes about 240 MiB as :class:`polars.String` and
    36 MiB as a categorical (4 bytes a row), so the names were most of those frames' memory
    (docs/PERFORMANCE.md, "The report over a big release"). A categorical sorts, groups, compares
    and prints as its text, and DuckDB reads a registered categorical as text (VARCHAR, ordered
    by its text: ``tests/io/test_categorical_names.py`` holds both to it), so every table is the
    same. One rule keeps it so: a frame made from literals or read back from SQL meets these
    through :func:`pagestats.core.columns.names_like` (polars joins no String key with a Categorical one).
    """
    tables = {t: categorical_frame(getattr(logs, t)) for t in ("inputs", "outcomes", "topk")}
    if all(tables[t] is getattr(logs, t) for t in tables):
        return logs
    return dataclasses.replace(logs, **tables)


@dataclass(frozen=True)
class FileRecord:
    """One log file a :class:`Logs` was read from: path, table, sha256 of its bytes, rows."""

    path: str
    table: str
    sha256: str
    rows: int


class LogTables(Protocol):
    """Validated logs as every stage reads them, held in memory (:class:`Logs`) or viewed where
    the files lie (:class:`pagestats.io.LogDB`): a caller reads either through these and never
    asks which it has.

    The analyses run in DuckDB over :meth:`cursor`'s relations; the polars frames that reach
    Python are the per-input rows a profile spec or a Python policy reads (:meth:`per_input`)
    and the outcome rows of the per-row frames (:meth:`outcome_rows`).
    """

    manifests: dict[str, dict]
    files: list[FileRecord]
    mode: str | None
    notes: list[str]

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of the caller's own on which ``inputs`` names the inputs (at least
        :data:`INPUT_COLUMNS`, and ``draw`` when logged); closing it leaves the logs open."""

    def relate_outcomes(self, con: duckdb.DuckDBPyConnection) -> None:
        """Make ``outcomes`` (at least :data:`OUTCOME_COLUMNS`) a relation on ``con``, a :meth:`cursor`."""

    def per_input(self, lists: Sequence[str] = (), *, topk: bool = False) -> Logs:
        """The per-input rows in memory: :data:`INPUT_COLUMNS` with the list (or struct) columns
        ``lists``, and the top-k rows when ``topk`` (``None`` where none are logged)."""

    def outcome_rows(self, evictor: str | None = None) -> pl.DataFrame:
        """The outcome rows (of ``evictor`` when given; :data:`OUTCOME_COLUMNS` at least) in key order
        (input key, evictor, budget) when read from files, as they are held otherwise."""

    def exclusion_report(self) -> list[str]:
        """One line per thing left out of the logs and why."""

    def typed_names(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (read back from SQL) with its name columns typed as the logs hold theirs, so that
        it joins and stacks with their frames (:func:`pagestats.core.columns.names_like`)."""


@dataclass
class Logs:
    """Validated logs: one tidy frame per level (inputs, outcomes, optional topk).

    Attributes
    ----------
    inputs : polars.DataFrame
        :data:`pagestats.core.schema.INPUTS` columns (heavy text columns only with
        ``columns="all"``) plus ``task_class`` — the run manifest's ``tasks{name: class}``,
        else :func:`pagestats.core.defaults.default_task_class`.
    outcomes : polars.DataFrame
        :data:`pagestats.core.schema.OUTCOMES` columns.
    topk : polars.DataFrame or None
        :data:`pagestats.core.schema.TOPK` rows, ``None`` when no topk files were given.
    manifests : dict
        run_id → parsed manifest.
    files : list of FileRecord
        Every file read, with its sha256 (reports cite these).
    exclusions : list of str
        One human-readable line per explicit exclusion, with the rows it removed, and one
        for the runs of another collection mode, left out (see ``mode``).
    problems : list of Problem
        Problems found (empty after a strict load).
    run_dirs : dict
        run_id → the directory of the run (runs read through a manifest).
    mode : str or None
        The collection mode the logs hold (:data:`pagestats.core.defaults.MODES`); ``None`` when
        read with every mode (validation only).
    notes : list of str
        Lines for the user about the validation itself (:mod:`pagestats.io.record`): that the
        row rules were skipped because the files are unchanged since they passed, or that a
        validation record could not be read or written.
    """

    inputs: pl.DataFrame
    outcomes: pl.DataFrame
    topk: pl.DataFrame | None
    manifests: dict[str, dict] = field(default_factory=dict)
    files: list[FileRecord] = field(default_factory=list)
    exclusions: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    run_dirs: dict[str, str] = field(default_factory=dict)
    mode: str | None = defaults.MODE
    notes: list[str] = field(default_factory=list)

    def exclusion_report(self) -> list[str]:
        """One line per exclusion, e.g. ``"run r1 task niah_multikey_3: 50 inputs, 1800 outcomes"``."""
        return list(self.exclusions)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """:meth:`LogTables.cursor`: a new in-memory connection with the inputs registered by
        reference, in key order, read on one thread, so that every sum adds its terms in one
        order and a rerun is bit-identical."""
        con = duck.connect(threads=1, memory_limit=duck.IN_MEMORY_REPLAY_LIMIT)
        try:
            inputs = with_task_class(self.inputs)
            require_columns(inputs, INPUT_COLUMNS, "inputs")
            con.register("inputs", inputs.select(*INPUT_COLUMNS, *(["draw"] if "draw" in inputs.columns else []))
                         .sort(INPUT_KEY))
        except BaseException:
            con.close()
            raise
        return con

    def relate_outcomes(self, con: duckdb.DuckDBPyConnection) -> None:
        """:meth:`LogTables.relate_outcomes`: the outcome rows registered by reference, in key order,
        checked for duplicates here (as the metrics check their frames). Apart from :meth:`cursor`,
        so that a replay that reads no outcome row (the pilot composition) copies none."""
        require_columns(self.outcomes, OUTCOME_COLUMNS, "outcomes")
        outcomes = self.outcomes.select(OUTCOME_COLUMNS)
        if repeats_a_key(outcomes, [*INPUT_KEY, "evictor", "budget"]):
            raise ValueError("outcomes: duplicate rows for the same (input, evictor, budget)")
        con.register("outcomes", outcomes.sort(*INPUT_KEY, "evictor", "budget"))

    def per_input(self, lists: Sequence[str] = (), *, topk: bool = False) -> Logs:
        """:meth:`LogTables.per_input`: these logs themselves (they hold every column already)."""
        return self

    def typed_names(self, frame: pl.DataFrame) -> pl.DataFrame:
        """:meth:`LogTables.typed_names`: text as the inputs hold it (categoricals in the report,
        :func:`categorical_names`)."""
        return names_like(frame, self.inputs)

    def outcome_rows(self, evictor: str | None = None) -> pl.DataFrame:
        """:meth:`LogTables.outcome_rows`: the frame itself, or its rows of ``evictor`` (no copy when it holds one)."""
        return self.outcomes if evictor is None else rows_where(self.outcomes, pl.col("evictor") == evictor)
