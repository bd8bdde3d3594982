"""Checks of the paths a command writes to, made before any log is read (docs/reliability.md).

One rule for every output path of the command line — ``report --out``, ``index --db``,
``prereg freeze --out``, ``whatif -o``, ``--temp-dir``: the path is not empty, and the
nearest part of it that exists is a folder that can be written (a path under a file, such as
``/dev/null/x``, is refused). :func:`folder_problem` adds what a folder target must be,
:func:`file_problem` what a file target must be, :func:`report_problem` what a report folder
must be. Each returns one line or ``None``; the command line prints it as a usage error (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The bytes a DuckDB database file holds at offset 8 (its header), checked before ``index --db``
#: replaces an existing file.
DUCKDB_MAGIC = b"DUCK"


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def parent_problem(text: str, option: str) -> str | None:
    """Why nothing can be created at ``text``: its nearest existing ancestor is not a writable folder."""
    for parent in Path(text).absolute().parents:
        try:
            exists = parent.exists()
        except OSError as err:
            return f"{option} {text}: cannot look at {parent} ({_reason(err)})"
        if exists:
            if not parent.is_dir():
                return f"{option} {text}: {parent} is not a folder"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{option} {text}: {parent} is not writable"
            return None
    return None


def folder_problem(text, option: str, *, create: bool = True) -> str | None:
    """Why ``text`` cannot be a folder to write into: empty, an existing non-folder, a folder that
    cannot be written, or (when it does not exist) a path whose parent cannot receive it."""
    text = os.fspath(text)
    if not text.strip():
        return f"{option} is empty; name a folder"
    path = Path(text)
    if path.exists() and not path.is_dir():
        return f"{option} {text} exists and is not a folder"
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{option} {text} is not writable"
        return None
    if not create:
        return f"{option} {text}: no such folder"
    return parent_problem(text, option)


def file_problem(text, option: str, *, replace: str = "any", suffixes: tuple[str, ...] = ()) -> str | None:
    """Why ``text`` cannot be a file to write: empty, a folder, a symbolic link, under a
    non-folder, with another extension than ``suffixes``; an existing file is refused when
    ``replace`` is ``"never"``, and unless it is a DuckDB database when it is ``"duckdb"``."""
    text = os.fspath(text)
    if not text.strip():
        return f"{option} is empty; name a file"
    path = Path(text)
    if suffixes and path.suffix.lower() not in suffixes:
        return f"{option} {text}: the extension must be one of {', '.join(suffixes)}"
    if text.endswith(("/", os.sep)) or path.is_dir():
        return f"{option} {text} is a folder, not a file"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return f"{option} {text} exists and is not a regular file"
    if path.exists():
        if replace == "never":
            return f"{option} {text} exists (it is never overwritten)"
        if replace == "duckdb" and path.stat().st_size > 0:
            try:
                with open(path, "rb") as fh:
                    head = fh.read(12)
            except OSError as err:
                return f"{option} {text}: cannot read it ({_reason(err)})"
            if head[8:12] != DUCKDB_MAGIC:
                return f"{option} {text} exists and is not a DuckDB database; it is not replaced"
    return parent_problem(text, option)


def report_problem(text, option: str) -> str | None:
    """Why ``text`` cannot receive a report: empty, an existing non-folder, or a non-empty folder
    that is not a previous report (one with ``index.json``, which a new report replaces)."""
    text = os.fspath(text)
    if not text.strip():
        return f"{option} is empty; name the report folder"
    path = Path(text)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        return f"{option} {text} exists and is not a folder"
    if path.is_dir():
        try:
            entries = {e.name for e in os.scandir(path)}
        except OSError as err:
            return f"{option} {text}: cannot list it ({_reason(err)})"
        if entries and "index.json" not in entries:
            return f"{option} {text} is a non-empty folder that is not a pagestats report; it is not replaced"
    return parent_problem(text, option)
