"""Row rules of the ``topk`` table (docs/SCHEMA.md): every row has an input, layer/head/indices in
range, every list is complete and every input has all its rows.

``layer`` in [0, L) (L = the input's ``agreement`` length), ``head`` in [0, H) (H from
the manifest, else the run's largest head + 1), ``indices`` in [0, n_tokens) without
repeats and of length min(k_max_stored, n_tokens) (k_max_stored from the manifest, else
the run's most common length); topk rows whose input is missing from ``inputs``; and,
for every input of a run that stores top-k lists (it has topk rows, or its manifest's
``gate.k_max_stored`` is positive and the topk table was read), exactly L·H rows — with
no duplicate and every layer and head in range, that is one row per (layer, head).

The rules run on the relation ``tk`` (topk rows without later duplicates) joined with
``inp``: one aggregate counts every rule, the bad rows are fetched only for those that fire.

References
----------
docs/SCHEMA.md (schema, reader rules).
"""

from __future__ import annotations

import polars as pl

from pagestats.core import schema
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import FIRST, FIRST_ROW, Problem, emit, frame, mode, one, value_text

_KEY = ", ".join(schema.INPUT_KEY)
_N_UNIQUE = "(len(list_distinct(indices)) + CASE WHEN list_count(indices) < len(indices) THEN 1 ELSE 0 END)"

#: (SQL condition on the joined rows, rule, detail): the row rules, in the order they report.
_ROW_RULES = (
    ("(layer < 0 OR layer >= _L)", "topk layer out of range", lambda r: f"layer {r['layer']} with L = {r['_L']}"),
    ("(head < 0 OR (_n_heads IS NOT NULL AND head >= _n_heads))", "topk head out of range",
     lambda r: f"head {r['head']} with H = {value_text(r['_n_heads'])}"),
    ("(len(indices) > 0 AND (list_min(indices) < 0 OR list_max(indices) >= n_tokens))",
     "topk indices outside [0, n_tokens)",
     lambda r: f"min {r['_min']}, max {r['_max']}, n_tokens {r['n_tokens']}"),
    (f"{_N_UNIQUE} != len(indices)", "topk indices repeat", lambda r: f"{r['_len']} indices, {r['_nu']} distinct"),
    ("(_kmax IS NOT NULL AND len(indices) != least(_kmax, n_tokens))", "topk list of the wrong length",
     lambda r: f"{r['_len']} indices, expected min(k_max_stored = {r['_kmax']}, n_tokens = {r['n_tokens']})"),
)


def _check_topk(con, files, runs, incomplete) -> list[Problem]:
    problems: list[Problem] = []
    observed = frame(con, "SELECT run_id, max(head) AS _hmax, len(indices) AS _len, count(*) AS n FROM tk "
                     "GROUP BY run_id, _len")
    per_run = []
    for (run_id,), sub in observed.group_by("run_id", maintain_order=True):
        hmax = sub["_hmax"].max()
        lengths = dict(sub.select("_len", "n").iter_rows())
        per_run.append({"run_id": run_id, "_H_obs": None if hmax is None else hmax + 1, "_len": mode(lengths)})
    observed = pl.DataFrame(per_run, schema={"run_id": pl.String, "_H_obs": pl.Int64, "_len": pl.Int64})
    manifest = _run_frame(runs).select("run_id", "_n_heads", "_k_max_stored")
    per_run = observed.join(manifest, on="run_id", how="full", coalesce=True).select(
        "run_id",
        pl.coalesce("_n_heads", "_H_obs").alias("_H"),
        pl.col("_n_heads"),
        pl.coalesce("_k_max_stored", "_len").alias("_kmax"),
        pl.col("_H_obs").is_not_null().alias("_has_topk"),
        (pl.col("_k_max_stored").fill_null(0) > 0).alias("_stores"),
    )
    con.register("_tk_runs", per_run)
    try:
        con.execute(f"""CREATE OR REPLACE TEMP VIEW _tk_j AS
            SELECT t._file, t._row, t.run_id, t.task, t.input_id, t.layer, t.head, t.indices, i.n_tokens, i._L,
                r._H, r._n_heads, r._kmax
            FROM tk t LEFT JOIN (SELECT {_KEY}, n_tokens, len(agreement) AS _L FROM inp) i USING ({_KEY})
            LEFT JOIN _tk_runs r USING (run_id)""")
        conds = [c for c, _, _ in _ROW_RULES]
        counts = one(con, "SELECT count(*) FILTER (WHERE n_tokens IS NULL), "
                     + ", ".join(f"count(*) FILTER (WHERE n_tokens IS NOT NULL AND {c})" for c in conds) + " FROM _tk_j")
        if "inputs" not in incomplete and counts[0]:
            problems += emit(con, f"""SELECT {FIRST_ROW}, * FROM (
                SELECT {_KEY}, {FIRST} AS _first, count(*) AS _n FROM _tk_j WHERE n_tokens IS NULL GROUP BY {_KEY})""",
                             files, "topk rows whose input is missing from inputs",
                             lambda r: f"input ({r['run_id']}, {r['task']}, {r['input_id']}) has {r['_n']} topk rows")
        for n, (cond, rule, detail) in zip(counts[1:], _ROW_RULES):
            if n:
                problems += emit(con, f"""SELECT _file, _row, layer, head, n_tokens, _L, _n_heads, _kmax,
                    list_min(indices) AS _min, list_max(indices) AS _max, len(indices) AS _len, {_N_UNIQUE} AS _nu
                    FROM _tk_j WHERE n_tokens IS NOT NULL AND {cond}""", files, rule, detail)
        if "topk" not in incomplete:
            problems += _check_rows_per_input(con, files)
    finally:
        con.execute("DROP VIEW IF EXISTS _tk_j")
        con.unregister("_tk_runs")
    return problems


def _check_rows_per_input(con, files) -> list[Problem]:
    """Every input of a run that stores top-k lists has exactly L·H topk rows."""
    query = f"""WITH counts AS (
            SELECT {_KEY}, count(*) AS _n, {FIRST} AS _tfirst FROM _tk_j WHERE n_tokens IS NOT NULL GROUP BY {_KEY}),
        expected AS (
            SELECT i._file, i._row, {", ".join(f"i.{k}" for k in schema.INPUT_KEY)}, len(i.agreement) AS _L, r._H
            FROM inp i JOIN (SELECT run_id, _H FROM _tk_runs WHERE (_has_topk OR _stores) AND _H IS NOT NULL) r
            USING (run_id))
        SELECT e._file, e._row, {", ".join(f"e.{k}" for k in schema.INPUT_KEY)}, e._L, e._H,
            coalesce(c._n, 0) AS _n, c._tfirst
        FROM expected e LEFT JOIN counts c USING ({_KEY}) WHERE coalesce(c._n, 0) != e._L * e._H"""

    def detail(r):
        return (f"input ({r['run_id']}, {r['task']}, {r['input_id']}) has {r['_n']} topk rows; expected L × H = "
                f"{value_text(r['_L'])} × {r['_H']}")

    none = emit(con, f"SELECT * FROM ({query}) WHERE _n = 0", files, "input without its topk rows", detail)
    some = emit(con, f"""SELECT * EXCLUDE (_file, _row), (_tfirst // 4294967296)::INTEGER AS _file,
        (_tfirst % 4294967296)::INTEGER AS _row FROM ({query}) WHERE _n > 0""", files,
                "topk rows missing for an input", detail)
    return none + some
