"""Why the logged decodes stopped, and which answers the decode limit may have cut (docs/SCHEMA.md).

A decode stops at the model's EOS, at a stop string of the task, or at the task's decode limit
(``stop_reason`` = ``eos`` / ``stop`` / ``length``; schema v2). A ``length`` stop is harmless when the
answer was complete before the limit, and it falsifies the outcome when the limit cut the answer:
the score then measures the limit, not eviction (PAGE §4 "Setup" decodes up to 128 new tokens for this
reason). Two label-based and one label-free reading of the logged text tell the cases apart:

* **cut inside a reference**: the text ends with a proper prefix of two or more characters of a reference that it
  does not contain whole, the prefix starting a word (case-insensitive, as RULER's matching). Such an
  answer was certainly cut. It needs no stop reason, so it also reads v1 logs.
* **looping**: the last third of the text's words adds no word its first two thirds had not written
  (numbers of one or two digits, list numbering, aside, and the last word, which the limit may have
  cut), e.g. ``hdeack hdeack hde``, ``1. 1575151 2. 1575151 3. 1575151``, or a haystack sentence copied
  over and over; at least :data:`LOOP_MIN_WORDS` words. A greedy decode that adds nothing new over its
  last third was past its answer when the limit came (docs/decisions.md, "Decode limits").
* every other ``length`` stop: the answer may have gone on.

:func:`decode_profile` gives, per (run, task, arm), the shares of these; :func:`limit_warnings` the
one-line warnings for a (run, task) whose full-KV answers stop at the limit without looping on more
than :data:`LENGTH_WARN_SHARE` of inputs, or are cut inside a reference at all. Both read only the
columns they need from the validated files, in DuckDB, and the texts only of the decodes the limit may
have cut; the full-KV rows of a profile are kept in the user cache by the files' sha256, so that the
``whatif`` after a ``validate`` does not read those texts again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import duckdb
import polars as pl

from pagestats.core import formulas, schema
from pagestats.io import duck, record
from pagestats.io.discovery import log_format
from pagestats.io.upgrades import V2_COLUMNS

__all__ = ["LENGTH_WARN_SHARE", "LOOP_MIN_WORDS", "decode_profile", "flagged_tasks", "limit_warnings", "text_flags"]

#: Share of a (run, task)'s full-KV answers that may stop at the limit (not looping) before it is flagged.
LENGTH_WARN_SHARE = 0.05
#: Fewest words a text needs before the loop reading applies.
LOOP_MIN_WORDS = 9

# The text ends with a proper prefix r[1:k] of a reference r it does not contain, the prefix starting a word
# (``_p``: the text in lower case, :func:`_read`).
_CUT = """coalesce(list_bool_or(list_transform("references", lambda r:
    NOT contains(_p, lower(r)) AND coalesce(list_bool_or(list_transform(range(2, length(r)), lambda k:
        ends_with(_p, lower(substr(r, 1, k)))
        AND (length(pred) = k OR NOT regexp_matches(substr(pred, length(pred) - k, 1), '[[:alnum:]]')))), false))),
    false)"""
# The run's directory name (a file <run>/inputs/<part> or <run>/outcomes/<part>), else its run_id (loose files);
# computed once per (file, run_id) group of the rows (:func:`_by_run`), not for every row.
_RUN_DIR = "coalesce(nullif(regexp_extract(filename, '([^/]+)/(inputs|outcomes)/[^/]+$', 1), ''), run_id)"
# The decodes the limit may have cut: those that stopped at it, and those whose reason a v1 log did not record.
_MAY_BE_CUT = f"stop_reason IN ('length', '{schema.STOP_UNKNOWN}')"
# Of those, the ones with a text to read (an empty or absent text neither loops nor ends inside a reference).
_READ_TEXT = f"{_MAY_BE_CUT} AND coalesce(pred, '') <> ''"
_CELL = ("run", "run_id", "task", "arm")
#: The columns of :func:`decode_profile`.
_PROFILE = {**{c: pl.String for c in _CELL}, **{c: pl.Int64 for c in (
    "n", "n_length", "n_looping", "n_cut", "n_unknown", "max_generated")}}
# Words (lower-case runs of letters and digits, ``_w``); the last third of them without the last word (``_tail``)
# must all occur among the first two thirds (``_head``), one- and two-digit numbers aside.
_LOOP = f"""(len(_w) >= {LOOP_MIN_WORDS} AND coalesce(list_bool_and(list_transform(_tail,
    lambda w: regexp_full_match(w, '[0-9]{{1,2}}') OR list_contains(_head, w))), false))"""


def _read(rows: str) -> str:
    """SQL of ``rows`` (with ``pred``, null read as '') and what :data:`_CUT` and :data:`_LOOP` read of it,
    each computed once per text: ``_p`` (lower case), ``_w`` (its words), ``_head`` and ``_tail``."""
    words = f"SELECT * REPLACE (coalesce(pred, '') AS pred) FROM ({rows})"
    words = f"SELECT *, lower(pred) AS _p, regexp_extract_all(lower(pred), '[a-z0-9]+') AS _w FROM ({words})"
    return (f"SELECT *, list_slice(_w, 1, _c) AS _head, list_slice(_w, _c + 1, len(_w) - 1) AS _tail "
            f"FROM (SELECT *, (2 * len(_w) + 2) // 3 AS _c FROM ({words}))")


def _relation(con: duckdb.DuckDBPyConnection, files, table: str, columns: dict[str, str]) -> str:
    """SQL of ``table``'s rows from ``files`` (FileRecord-like: ``path``, ``table``), one expression per
    output column; a v2 column a file lacks (a v1 log) reads as its upgrade value."""
    paths = [f.path for f in files if f.table == table]
    parquet = [p for p in paths if log_format(p) == "parquet"]
    parts = []
    if parquet:
        listed = ", ".join("'" + p.replace("'", "''") + "'" for p in parquet)
        con.execute(f"CREATE OR REPLACE TEMP VIEW _dec_{table}_pq AS SELECT * FROM read_parquet([{listed}], "
                    "union_by_name = true, filename = true)")
        parts.append(f"_dec_{table}_pq")
    others = [p for p in paths if log_format(p) != "parquet"]
    if others:
        frame = pl.concat([pl.read_ndjson(p).with_columns(pl.lit(p).alias("filename")) for p in others],
                          how="diagonal_relaxed")
        con.register(f"_dec_{table}_js", frame)
        parts.append(f"_dec_{table}_js")
    if not parts:
        return None
    selects = []
    for part in parts:
        have = {r[0] for r in con.execute(f"DESCRIBE {part}").fetchall()}
        exprs = []
        added = {n: ("NULL" if v is None else repr(v)) for n, _, v in V2_COLUMNS.get(table, ())}  # an upgraded v1 row
        for name, expr in columns.items():
            if expr in added and expr in have:  # union_by_name: NULL in the v1 files of the view
                exprs.append(f"coalesce({expr}, {added[expr]}) AS {name}")
            elif expr in added:
                exprs.append(f"{added[expr]} AS {name}")
            else:
                exprs.append(f"{expr} AS {name}")
        selects.append(f"SELECT {', '.join(exprs)} FROM {part}")
    return " UNION ALL BY NAME ".join(selects)


def _rows(con, files, *, arms: bool, text: bool) -> str | None:
    """SQL of one row per decode: filename, run_id, task, input_id, arm ('full' or the evictor), budget,
    stop_reason, n_generated (``None`` without inputs files). With ``text``, only the decodes the limit
    may have cut that logged a text (:data:`_READ_TEXT`; imported runs log none), each with its ``pred`` and
    its input's ``references``; without it, no text column is read."""
    texts = {"pred": "full_prediction", '"references"': '"references"'} if text else {}
    inputs = _relation(con, files, "inputs", {"filename": "filename", "run_id": "run_id", "task": "task",
                                              "input_id": "input_id", "stop_reason": "full_stop_reason",
                                              "n_generated": "full_n_generated", **texts})
    if inputs is None:
        return None
    keep = f" WHERE {_READ_TEXT}" if text else ""
    full = f"SELECT * EXCLUDE (input_id), 'full' AS arm FROM ({inputs}){keep}"
    if not arms:
        return full
    outcomes = _relation(con, files, "outcomes", {"filename": "filename", "run_id": "run_id", "task": "task",
                                                  "input_id": "input_id", "arm": "evictor", "budget": "budget",
                                                  "stop_reason": "stop_reason", "n_generated": "n_generated",
                                                  **({"pred": "prediction"} if text else {})})
    if outcomes is None:
        return full
    evicted = f"SELECT * FROM ({outcomes}) WHERE {formulas.evicted()}" + (f" AND {_READ_TEXT}" if text else "")
    if text:  # the references are the input's
        refs = _relation(con, files, "inputs", {"run_id": "run_id", "task": "task", "input_id": "input_id",
                                                '"references"': '"references"'})
        evicted = f"SELECT * FROM ({evicted}) JOIN ({refs}) USING (run_id, task, input_id)"
    return f"{full} UNION ALL BY NAME SELECT * EXCLUDE (input_id, budget) FROM ({evicted})"


def decode_profile(files, *, arms: bool = True, arm_texts: bool = True) -> pl.DataFrame:
    """Per (run, run_id, task, arm): how the decodes stopped (two copies of one run count apart).

    Two queries: the counts read no text; the text readings (looping, cut inside a reference) read the
    texts of the decodes the limit may have cut only, those that stopped by ``length`` or for a reason a
    v1 log did not record (:data:`_MAY_BE_CUT`), and do not run when there is none. A decode that
    stopped at EOS or at a stop string was not cut by the limit, so at 1M inputs whose decodes end at
    EOS no text is read (docs/PERFORMANCE.md, "The first calls on a new release"). The full-KV rows
    are kept in the user cache by the inputs files' sha256 (:func:`_kept_path`); a later call with
    ``arms=False`` on the same files returns them without reading the files.

    Parameters
    ----------
    files : sequence of FileRecord
        Validated log files (``Logs.files``, ``LogDB.files``, ``Checked.files``).
    arms : bool
        Also the evicted arms (every evictor at budgets b < 1; budget-1.0 rows repeat the full arm);
        otherwise the full-KV answers only (the inputs table).
    arm_texts : bool
        Also read the evicted arms' texts (``n_looping``, ``n_cut``); otherwise those two are null on
        the evicted arms' rows and only the full-KV texts are read, which alone decide
        :func:`limit_warnings`. The evicted texts are most of the cost: at 1M inputs with answers like
        the shipped logs' (a quarter stopped at the limit), splitting 2M of them into words takes
        about 12 CPU seconds in DuckDB, six times the what-if's own query (docs/decisions.md,
        "Validate reads the full-KV texts only").

    Returns
    -------
    polars.DataFrame
        ``run, run_id, task, arm, n, n_length, n_looping, n_cut, n_unknown, max_generated`` — decodes, those
        that stopped at the limit, those of them that loop, those that stopped at the limit (or for an
        unrecorded reason) with a text that ends inside a reference, those whose reason a v1 log did not
        record, and the most tokens any generated (null in v1 logs); ``run`` is the run's directory name
        (its run_id for loose files). Sorted by run, task, arm ('full' first).
    """
    kept = _kept_path(files)
    if not arms and kept is not None:
        found = _kept(kept)
        if found is not None:
            return found
    con = duck.connect()
    try:
        rows = _rows(con, files, arms=arms, text=False)
        if rows is None:
            raise ValueError("no inputs files to profile")
        counts = con.sql(_by_run(f"""
            SELECT filename, run_id, task, arm, count(*) AS n, count_if(stop_reason = 'length') AS n_length,
                   count_if(stop_reason = '{schema.STOP_UNKNOWN}') AS n_unknown, max(n_generated) AS max_generated
            FROM ({rows}) GROUP BY filename, run_id, task, arm""", ("n", "n_length", "n_unknown"), ("max_generated",))).pl()
        readings = pl.DataFrame(schema={k: pl.String for k in _CELL} | {"n_looping": pl.Int64, "n_cut": pl.Int64})
        if (counts["n_length"] + counts["n_unknown"]).sum() > 0:
            readings = con.sql(_by_run(f"""
                SELECT filename, run_id, task, arm, count_if({_LOOP}) AS n_looping, count_if({_CUT}) AS n_cut
                FROM ({_read(_rows(con, files, arms=arms and arm_texts, text=True))})
                GROUP BY filename, run_id, task, arm""", ("n_looping", "n_cut"))).pl()
    finally:
        con.close()
    read = (pl.col("arm") == "full") | arm_texts  # the rows whose texts were read: a missing reading counts 0
    out = counts.join(readings, on=list(_CELL), how="left").with_columns(
        pl.when(read).then(pl.col(c).fill_null(0)).alias(c) for c in ("n_looping", "n_cut"))
    out = out.select(*_CELL, "n", "n_length", "n_looping", "n_cut", "n_unknown", "max_generated").cast(
        _PROFILE).sort("run", "run_id", "task", pl.col("arm") != "full", "arm")
    if kept is not None:
        _keep(kept, out.filter(pl.col("arm") == "full"))
    return out


def _by_run(counts: str, sums: tuple[str, ...], most: tuple[str, ...] = ()) -> str:
    """SQL of ``counts`` (rows per filename, run_id, task, arm) per (run, run_id, task, arm): the columns
    ``sums`` summed, ``most`` their maximum, as BIGINT."""
    values = [f"sum({c})::BIGINT AS {c}" for c in sums] + [f"max({c})::BIGINT AS {c}" for c in most]
    return (f"SELECT run, run_id, task, arm, {', '.join(values)} FROM (SELECT {_RUN_DIR} AS run, * FROM ({counts})) "
            "GROUP BY run, run_id, task, arm")


def _kept_path(files) -> Path | None:
    """Where the full-KV profile of ``files`` is kept in the user cache (:func:`pagestats.io.record.cache_dir`,
    under ``decoded/``): named by the real paths and sha256 of the inputs files and by the validator's digest
    (this module's code and the libraries' versions), so that a changed file or code reads the texts again.
    ``None`` when a file has no sha256.

    ``validate`` (every arm) keeps the full-KV rows; each later ``whatif`` or ``report`` on the same
    files (the validation record gives their sha256) reads them here instead of reading the full-KV
    answers' texts again (docs/PERFORMANCE.md, "The first calls on a new release")."""
    inputs = sorted((os.path.realpath(f.path), f.sha256) for f in files if f.table == "inputs")
    if not inputs or not all(isinstance(sha, str) and sha for _, sha in inputs):
        return None
    key = hashlib.sha256(json.dumps([inputs, record.validator_digest()]).encode()).hexdigest()
    return record.cache_dir() / "decoded" / f"{key}.json"


def _kept(path: Path) -> pl.DataFrame | None:
    """The profile kept at ``path``; ``None`` when there is none or it cannot be read (it is then made again)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return pl.DataFrame(rows, schema=_PROFILE, orient="row")
    except (OSError, UnicodeDecodeError, ValueError, TypeError, pl.exceptions.PolarsError):
        return None


def _keep(path: Path, profile: pl.DataFrame) -> None:
    """Write ``profile`` at ``path`` atomically; a cache folder that cannot be written is left as it is
    (the profile is then made from the files again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".decoded-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(profile.rows(), fh)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return


def text_flags(predictions, references) -> pl.DataFrame:
    """Per text, the two readings :func:`decode_profile` counts: ``cut`` (ends inside a reference it
    does not contain) and ``looping`` (its tail repeats one unit at least twice). For one-off checks
    and tests; ``references`` is one list of strings per prediction."""
    frame = pl.DataFrame({"pred": list(predictions), "references": [list(r) for r in references]},
                         schema={"pred": pl.String, "references": pl.List(pl.String)})
    con = duck.connect(threads=1)
    try:
        con.register("_texts", frame)
        return con.sql(f"SELECT {_CUT} AS cut, {_LOOP} AS looping FROM ({_read('SELECT * FROM _texts')})").pl()
    finally:
        con.close()


def flagged_tasks(profile: pl.DataFrame) -> pl.DataFrame:
    """(run_id, task) rows of the full-KV ``profile`` whose answers the decode limit may have cut:
    more than :data:`LENGTH_WARN_SHARE` of them stopped at the limit without looping, or any one ends
    inside a reference. Columns: ``run_id, task, n, n_length, n_looping, n_cut, n_unknown``."""
    full = profile.filter(pl.col("arm") == "full")
    open_ended = (pl.col("n_length") - pl.col("n_looping")).clip(lower_bound=0)
    return full.filter((open_ended > LENGTH_WARN_SHARE * pl.col("n")) | (pl.col("n_cut") > 0)).select(
        "run", "run_id", "task", "n", "n_length", "n_looping", "n_cut", "n_unknown")


def limit_warnings(profile: pl.DataFrame, limits: dict[tuple[str, str], int | None] | None = None) -> list[str]:
    """One line per flagged (run, task) (:func:`flagged_tasks`), naming the counts and the limit."""
    lines = []
    for r in flagged_tasks(profile).iter_rows(named=True):
        limit = (limits or {}).get((r["run_id"], r["task"]))
        at = f"the {limit}-token decode limit" if limit else "the decode limit"
        if r["n_unknown"] == r["n"]:
            what = (f"{r['n_cut']} of {r['n']} full-KV answers end inside a reference (the v1 log did not record "
                    f"why decodes stopped; the limit may have cut more)")
        else:
            what = (f"{r['n_length']} of {r['n']} full-KV answers stopped at {at} ({r['n_looping']} of them looping), "
                    f"{r['n_cut']} end inside a reference")
        lines.append(f"warning: {r['run']}/{r['task']}: {what}; its outcomes may measure the decode limit, not "
                     f"eviction (re-collect with a longer --max-new-tokens {r['task']}=N)")
    return lines
