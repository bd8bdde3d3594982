"""The containers of loaded logs: :class:`Logs` (the tables of :func:`pagestats.io.load` as polars
frames, with the manifests, the files read and what was left out) and :class:`FileRecord` (one file
read, with its sha256); :data:`HEAVY_COLUMNS`, the text columns ``columns="analysis"`` leaves out;
:func:`categorical_names`, the logs with their name columns as categoricals (the report's memory)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import polars as pl

from pagestats import defaults
from pagestats.io.validation.problems import Problem

#: Text columns left out by ``columns="analysis"`` (they can be huge).
HEAVY_COLUMNS = ("prompt", "full_prediction", "prediction", "references")

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
    through :func:`pagestats.columns.names_like` (polars joins no String key with a Categorical one).
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


@dataclass
class Logs:
    """Validated logs: one tidy frame per level (inputs, outcomes, optional topk).

    Attributes
    ----------
    inputs : polars.DataFrame
        :data:`pagestats.schema.INPUTS` columns (heavy text columns only with
        ``columns="all"``) plus ``task_class`` — the run manifest's ``tasks{name: class}``,
        else :func:`pagestats.defaults.default_task_class`.
    outcomes : polars.DataFrame
        :data:`pagestats.schema.OUTCOMES` columns.
    topk : polars.DataFrame or None
        :data:`pagestats.schema.TOPK` rows, ``None`` when no topk files were given.
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
        The collection mode the logs hold (:data:`pagestats.defaults.MODES`); ``None`` when
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
