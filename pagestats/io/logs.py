"""The containers of loaded logs: :class:`Logs` (the tables of :func:`pagestats.io.load` as polars
frames, with the manifests, the files read and what was left out) and :class:`FileRecord` (one file
read, with its sha256); :data:`HEAVY_COLUMNS`, the text columns ``columns="analysis"`` leaves out."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pagestats import defaults
from pagestats.io.validation.problems import Problem

#: Text columns left out by ``columns="analysis"`` (they can be huge).
HEAVY_COLUMNS = ("prompt", "full_prediction", "prediction", "references")


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
