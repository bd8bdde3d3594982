"""Reading one JSON Lines file of a release: its records as a polars frame, its schema recognised
from the records (never from its name), and every bad line named.

DuckDB parses the file (``read_json``, every record sampled, so a key that appears late is seen);
the frame keeps the file's order and carries ``_line``, the 1-based line of each record. When DuckDB
cannot read the file as records of JSON objects (a malformed line, a line that is not an object), the
file is read again line by line to name the first bad lines: a diagnosis, never a second way to
import.

What the code cannot do: it reads JSON Lines only (one object per line), as the release writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from pagestats.io.duck import connect

#: Schema name → (keys every record must have, keys that mark it). A file's schema is the first
#: whose marking keys its records hold; docs/IMPORT.md describes each.
SCHEMAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "profile": (("task", "T", "head_agreement_per_layer"), ("head_agreement_per_layer",)),
    "adakv": (("id", "task", "budget", "T", "drop", "gate_open", "correct_full", "correct_plain_shared",
               "n_kept_shared", "correct_plain_adakv", "n_kept_adakv"), ("correct_full", "correct_plain_shared")),
    "sweep": (("id", "task", "budget", "T", "n_kept", "correct"), ("correct", "n_kept")),
    "gated": (("id", "task", "budget", "T", "drop", "gate_open", "n_kept_plain", "correct_plain", "correct_gated"),
              ("drop", "gate_open", "correct_gated")),
}
#: The most bad lines named for one file.
MAX_LINES_NAMED = 5


class RecordError(ValueError):
    """A file whose records cannot be imported; ``lines`` holds one message per bad line."""

    def __init__(self, path: str, lines: list[str]):
        self.path, self.lines = path, lines
        super().__init__("\n".join(lines))


@dataclass
class Records:
    """One file's records: ``frame`` (one row per record, file order, with ``_line``) and its ``schema``."""

    path: str
    frame: pl.DataFrame
    schema: str | None  # None: no schema this importer reads
    why: str = ""  # for schema None: what the records are, in a few words


def _line_numbers(raw: bytes) -> np.ndarray:
    """1-based numbers of the lines of ``raw`` that hold something other than white space (vectorised:
    only a line that starts with white space is looked at in Python)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size == 0:
        return np.zeros(0, dtype=np.int64)
    newlines = np.flatnonzero(data == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [data.size]))
    filled = ends > starts
    first = data[np.minimum(starts, data.size - 1)]
    doubtful = np.flatnonzero(filled & np.isin(first, (9, 13, 32)))  # tab, CR, space
    for i in doubtful:
        filled[i] = bool(raw[starts[i]:ends[i]].strip())
    return np.flatnonzero(filled) + 1


def _diagnose(path: str, raw: bytes) -> list[str]:
    """The first bad lines of a file DuckDB could not read as records of objects."""
    out = []
    for number, text in enumerate(raw.split(b"\n"), start=1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            out.append(f"{path}:{number}: not a JSON object ({err.msg if hasattr(err, 'msg') else err})")
        else:
            if not isinstance(value, dict):
                out.append(f"{path}:{number}: a JSON {type(value).__name__}, not an object")
        if len(out) >= MAX_LINES_NAMED:
            break
    return out or [f"{path}: DuckDB cannot read it as JSON Lines records"]


def read_records(path: str) -> Records:
    """The records of the JSON Lines file ``path`` and their schema.

    Raises
    ------
    RecordError
        The file is not JSON Lines of objects; the message names its first bad lines.
    OSError
        The file cannot be read.
    """
    with open(path, "rb") as fh:
        raw = fh.read()
    if not raw.strip():
        return Records(path, pl.DataFrame(), None, "it holds no records (an empty stub)")
    con = connect()
    try:
        with open(path, "rb") as fh:
            relation = con.read_json(fh, format="newline_delimited", sample_size=-1)
            if [str(t).upper() for t in relation.types] == ["JSON"]:  # some line is not an object
                raise RecordError(path, _diagnose(path, raw))
            frame = pl.from_arrow(relation.to_arrow_table())
    except duckdb.InvalidInputException:
        raise RecordError(path, _diagnose(path, raw)) from None
    finally:
        con.close()
    lines = _line_numbers(raw)
    if len(lines) != frame.height:  # cannot happen for JSON Lines DuckDB read; named rather than guessed
        raise RecordError(path, [f"{path}: {frame.height} records on {len(lines)} non-empty lines"])
    frame = frame.with_columns(pl.Series("_line", lines))
    keys = set(frame.columns)
    for name, (_, marks) in SCHEMAS.items():
        if set(marks) <= keys:
            return Records(path, frame, name)
    return Records(path, frame, None, f"its records (keys {sorted(keys - {'_line'})[:8]}) match no schema "
                   "this importer reads")


def missing_keys(records: Records) -> list[str]:
    """One line per record that lacks a key its schema requires (or holds null there)."""
    required = SCHEMAS[records.schema][0]
    absent = [k for k in required if k not in records.frame.columns]
    if absent:
        return [f"{records.path}: no record has {', '.join(repr(k) for k in absent)}"]
    frame = records.frame.select("_line", *required)
    bad = frame.filter(pl.any_horizontal(pl.col(k).is_null() for k in required)).head(MAX_LINES_NAMED)
    return [f"{records.path}:{row['_line']}: missing {', '.join(repr(k) for k in required if row[k] is None)}"
            for row in bad.iter_rows(named=True)]
