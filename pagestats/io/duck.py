"""Every DuckDB connection pagestats opens: one place that sets the memory limit and the folder
DuckDB spills to (docs/ARCHITECTURE.md, "Out of core"; docs/PERFORMANCE.md). Imports only DuckDB.
"""

from __future__ import annotations

import os
import tempfile

import duckdb

#: DuckDB's memory limit unless a command is given ``--memory-limit``.
MEMORY_LIMIT = "2GB"

#: DuckDB's memory limit on a replay of in-memory logs (:class:`pagestats.replay.Replay`). Its
#: relations are the process's own polars frames, registered by reference, so the limit bounds
#: only the queries' working state, beside frames the process already holds; DuckDB spills past
#: it. At 1M inputs the threshold curve of Fig. 6 took 1.9 GiB above those frames under 2GB and
#: 0.9 GiB under 1GB, in the same time (docs/PERFORMANCE.md, "Sixth round").
IN_MEMORY_REPLAY_LIMIT = "1GB"


def spill_directory(temp_directory: str | None = None) -> str:
    """The folder DuckDB spills to: ``temp_directory``, else ``pagestats-duckdb`` in the system temp folder."""
    return temp_directory or os.path.join(tempfile.gettempdir(), "pagestats-duckdb")


def connect(database: str = ":memory:", *, memory_limit: str = MEMORY_LIMIT, temp_directory: str | None = None,
            read_only: bool = False, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with ``memory_limit`` and a spill folder (:func:`spill_directory`).

    Parameters
    ----------
    database : str
        A database file, or ``":memory:"``.
    memory_limit : str
        DuckDB's memory limit (its grammar: ``"2GB"``, ``"512MiB"``, …).
    temp_directory : str, optional
        Where DuckDB spills (default :func:`spill_directory`).
    read_only : bool
        Open ``database`` read-only.
    threads : int, optional
        DuckDB's thread count (default: DuckDB's, every core). One thread makes the order of a
        floating-point sum, and so its last bits, the same on every call.
    """
    # background threads hand freed memory back to the system (without them a big result's pages
    # stay resident after it is read: about 1 GiB after reading 9M outcome rows)
    config = {"memory_limit": memory_limit, "temp_directory": spill_directory(temp_directory),
              "allocator_background_threads": True}
    if threads is not None:
        config["threads"] = threads
    return duckdb.connect(database, read_only=read_only, config=config)

