"""Row rules of the ``outcomes`` table (docs/SCHEMA.md): ranges, orphans, the budget grid, the audit arm.

``score`` in [0, 1]; ``budget`` in (0, 1]; outcomes without an input and inputs without
outcomes; ``n_kept`` in [1, n_tokens]; the budget-1.0 arm equal to the full-KV outcome
(score = full_score within :data:`SCORE_TOLERANCE`, n_kept = n_tokens); the same budget
grid for every (input, evictor) and the same evictor set for every input of a run (the
manifest's evictors × budgets, when it lists them), with no outcome row twice.

One DuckDB aggregate does the work for valid logs: the outcome rows grouped per input
(row count, a set signature of the arms — count and sum of :data:`CELL_HASH` —, n_kept
extremes, the budget-1.0 arm's extremes, and one bit per range or null rule that any row
breaks), joined with ``inp`` and summed per (run, signature). Only when a rule fires are
its rows fetched, and arms are compared exactly only for the inputs whose signature
differs from the reference. (The per-input aggregate keeps as few columns as it can: at
1M inputs each one costs; docs/PERFORMANCE.md, "The first calls on a new release".)

References
----------
PAGE paper, §4 "Setup" (budgets, full-cache audit arm at b = 1). docs/SCHEMA.md (schema,
reader rules).
"""

from __future__ import annotations

import polars as pl

from pagestats.core import schema
from pagestats.io.validation.problems import (
    FIRST,
    FIRST_ROW,
    Problem,
    duplicate_rules,
    emit,
    first_row,
    frame,
    null_problems,
    one,
    out_of_range,
    value_text,
)

#: Tolerance of the budget-1.0 vs full-KV score check.
SCORE_TOLERANCE = 1e-9

#: 32-bit hash of one (evictor, budget) arm; an input's arms are summarised by their count
#: and the sum of these (a set signature: equal sets give equal sums).
CELL_HASH = "(hash(evictor, budget) & 4294967295)"

_SCORE_BAD = out_of_range("score", 0.0, 1.0)
_BUDGET_BAD = out_of_range("budget", 0.0, 1.0, lo_open=True)
#: An audit-arm row that differs from the full-KV outcome (NaN differences are not > tolerance).
_FULL_BAD = (f"(NOT isnan(score - full_score) AND abs(score - full_score) > {SCORE_TOLERANCE!r}) "
             "OR isnan(score) != isnan(full_score) OR n_kept != n_tokens")
_KEY = ", ".join(schema.INPUT_KEY)
_ON = " AND ".join(f"p.{k} = i.{k}" for k in schema.INPUT_KEY)



def joined(flags: str | None = None, *, first: bool = False) -> str:
    """SQL ``WITH ... joined``: per input (outcome rows grouped by the input key) joined with the
    inputs; the columns ``_has_input`` / ``_has_outcomes`` mark the two kinds of orphans.
    ``flags``: an SQL bit mask per outcome row, OR-ed per input into ``_flags``; ``first``: the
    input's first outcome row (``_first``, :data:`FIRST`) and the input's ``_ifile``, ``_irow``
    (wanted by the queries that fetch bad rows only). The budget-1.0 arm's extremes are those
    of its rows (DuckDB orders NaN above every number, so ``_s1max`` is NaN when one score is)."""
    b1 = "CASE WHEN budget = 1.0 THEN {} END"
    return f"""
WITH per_input AS (
    SELECT {_KEY}, {f"{FIRST} AS _first, " if first else ""}count(*) AS _n, min(n_kept) AS _kmin,
        max(n_kept) AS _kmax, sum({CELL_HASH}) AS _sig,
        min({b1.format("score")}) AS _s1min, max({b1.format("score")}) AS _s1max,
        min({b1.format("n_kept")}) AS _k1min, max({b1.format("n_kept")}) AS _k1max
        {f", bit_or({flags}) AS _flags" if flags else ""}
    FROM outcomes GROUP BY {_KEY}),
joined AS (
    SELECT coalesce(p.run_id, i.run_id) AS run_id, coalesce(p.task, i.task) AS task,
        coalesce(p.input_id, i.input_id) AS input_id, p.* EXCLUDE ({_KEY}), i.n_tokens, i.full_score,
        {"i._file AS _ifile, i._row AS _irow, " if first else ""}p._n IS NOT NULL AS _has_outcomes,
        i._in IS NOT NULL AS _has_input
    FROM per_input p FULL JOIN (SELECT {_KEY}, n_tokens, full_score{", _file, _row" if first else ""}, TRUE AS _in
                                FROM inp) i ON {_ON})
"""


#: :func:`joined` with the first rows, for the queries that fetch bad rows.
_JOINED = joined(first=True)

_KEPT_CANDIDATE = "_has_input AND _has_outcomes AND (_kmin < 1 OR _kmax > n_tokens)"
_FULL_CANDIDATE = (f"_has_input AND _s1min IS NOT NULL AND (isnan(_s1max) OR isnan(full_score) OR _s1max - full_score > "
                   f"{SCORE_TOLERANCE!r} OR full_score - _s1min > {SCORE_TOLERANCE!r} OR _k1min != n_tokens "
                   "OR _k1max != n_tokens)")


def _check_outcomes(con, files, runs, incomplete, nulls) -> list[Problem]:
    """The rules of this module; ``nulls`` (:func:`~pagestats.io.validation.problems.null_checks`
    of ``outcomes``) are counted in the same aggregate and reported first."""
    problems: list[Problem] = []
    rules = [_SCORE_BAD, _BUDGET_BAD, *(cond for cond, _, _ in nulls)]
    if len(rules) > 63:
        raise ValueError(f"{len(rules)} row rules do not fit the 63 bits of one BIGINT mask")
    summary = frame(con, f"""{joined(" | ".join(f"(({c})::BIGINT << {i})" for i, c in enumerate(rules)))}
        SELECT run_id, _n, _sig, _has_input, _has_outcomes, count(*) AS n,
            any_value({{'task': task, 'input_id': input_id}}) AS _one, bit_or(_flags) AS _flags,
            count(*) FILTER (WHERE {_KEPT_CANDIDATE}) AS _c_kept, count(*) FILTER (WHERE {_FULL_CANDIDATE}) AS _c_full
        FROM joined GROUP BY ALL""")
    totals = summary.select(pl.col("_c_kept", "_c_full").sum()).row(0, named=True)
    mask = 0
    for flags in summary["_flags"].drop_nulls():
        mask |= flags
    broken = [bool(mask >> i & 1) for i in range(len(rules))]  # the rules some row breaks
    problems += null_problems(con, "outcomes", nulls, broken[2:], files)
    if broken[0]:
        problems += emit(con, f"SELECT _file, _row, score FROM outcomes WHERE {_SCORE_BAD}", files,
                         "score outside [0, 1] or NaN", lambda r: f"score = {value_text(r['score'])}")
    if broken[1]:
        problems += emit(con, f"SELECT _file, _row, budget FROM outcomes WHERE {_BUDGET_BAD}", files,
                         "budget outside (0, 1] or NaN", lambda r: f"budget = {value_text(r['budget'])}")

    # orphans both ways
    if "inputs" not in incomplete and summary.filter(~pl.col("_has_input")).height:
        problems += emit(con, f"{_JOINED} SELECT {FIRST_ROW}, {_KEY}, _n FROM joined WHERE NOT _has_input", files,
                         "outcomes whose input is missing from inputs",
                         lambda r: f"input ({value_text(r['run_id'])}, {value_text(r['task'])}, "
                                   f"{value_text(r['input_id'])}) has {r['_n']} outcome rows")
    if "outcomes" not in incomplete and summary.filter(~pl.col("_has_outcomes")).height:
        problems += emit(con, f"{_JOINED} SELECT _ifile AS _file, _irow AS _row FROM joined WHERE NOT _has_outcomes",
                         files, "input with no outcomes")

    rows = f"SELECT o._file, o._row, o.evictor, o.score, o.n_kept, i.full_score, i.n_tokens FROM outcomes o JOIN inp i USING ({_KEY})"
    # n_kept in [1, n_tokens]
    if totals["_c_kept"]:
        problems += emit(con, f"{rows} WHERE o.n_kept < 1 OR o.n_kept > i.n_tokens", files,
                         "n_kept outside [1, n_tokens]", lambda r: f"n_kept = {r['n_kept']}, n_tokens = {r['n_tokens']}")
    # the budget-1.0 arm reproduces the full-KV outcome (§4 "Setup": full-cache audit)
    if totals["_c_full"]:
        problems += emit(con, f"{rows} WHERE o.budget = 1.0 AND ({_FULL_BAD})", files,
                         "budget 1.0 outcome differs from the full-KV outcome",
                         lambda r: f"evictor {r['evictor']}: score {value_text(r['score'])} vs full_score "
                                   f"{value_text(r['full_score'])}, n_kept {r['n_kept']} vs n_tokens {r['n_tokens']}")

    problems += _check_grid(con, summary.filter(pl.col("_has_outcomes")), files, runs)
    return problems


def _signature(con, cells) -> tuple[int, int]:
    """Count and :data:`CELL_HASH` sum of a set of (evictor, budget) arms, as DuckDB computes them."""
    frame = pl.DataFrame({"evictor": [e for e, _ in cells], "budget": [float(b) for _, b in cells]},
                         schema={"evictor": pl.String, "budget": pl.Float64})
    con.register("_cells", frame)
    try:
        n, sig = one(con, f"SELECT count(*), coalesce(sum({CELL_HASH}), 0) FROM _cells")
    finally:
        con.unregister("_cells")
    return n, int(sig)


def _check_grid(con, per_run: pl.DataFrame, files, runs) -> list[Problem]:
    """Every (input, evictor) of a run has the same budget grid and every input the same
    evictor set (and no outcome row twice): the manifest's evictors × budgets when it
    lists them, else the run's most common set of arms."""
    problems: list[Problem] = []
    for run_id in sorted(per_run["run_id"].unique().drop_nulls().to_list()):
        sub = per_run.filter(pl.col("run_id") == run_id)
        usual = (sub.group_by("_n", "_sig").agg(pl.col("n").sum(), pl.col("_one").first())
                 .sort(["n", "_n"], descending=[True, False]).row(0, named=True))
        example = usual["_one"]
        usual_cells = sorted(con.sql(
            "SELECT DISTINCT evictor, budget FROM outcomes WHERE run_id = $r AND task = $t AND input_id = $i",
            params={"r": run_id, "t": example["task"], "i": example["input_id"]}).fetchall())
        info = runs.get(run_id)
        if info is not None and info.evictors is not None and info.budgets is not None:
            manifest_cells = list(info.arms) if info.arms else sorted((e, b) for e in info.evictors for b in info.budgets)
            if set(manifest_cells) != set(usual_cells):
                # reported once for the run; inputs are then compared with the run's usual arms
                file, row = _first_row(con, run_id)
                problems.append(Problem(files[file], row,
                                        f"the usual arms of run {run_id!r} differ from the manifest's evictors × "
                                        f"budgets: {_cells_diff(usual_cells, manifest_cells)}"))
                reference, source = usual_cells, "the run's usual"
            else:
                reference, source = manifest_cells, "the manifest's"
        else:
            reference, source = usual_cells, "the run's usual"
        ref_n, ref_sig = _signature(con, reference)
        if sub.filter((pl.col("_n") != ref_n) | (pl.col("_sig") != ref_sig)).height:
            con.execute(f"""CREATE OR REPLACE TEMP TABLE _odd_keys AS {joined()}
                SELECT {_KEY} FROM joined WHERE _has_outcomes AND run_id = $r AND (_n != $n OR _sig != $sig)""",
                        {"r": run_id, "n": ref_n, "sig": ref_sig})
            con.execute(f"CREATE OR REPLACE TEMP VIEW _odd_rows AS SELECT * FROM outcomes SEMI JOIN _odd_keys "
                        f"USING ({_KEY})")
            p, _ = duplicate_rules(con, "_odd_rows", schema.OUTCOME_KEY, files, "outcome row")
            problems += p
            problems += _exact_grid(con, reference, source, run_id, files)
            for name in ("_odd_rows_kept", "_odd_rows"):
                con.execute(f"DROP VIEW IF EXISTS {name}")
            for name in ("_odd_keys", "_later__odd_rows", "_dups__odd_rows"):
                con.execute(f"DROP TABLE IF EXISTS {name}")
        imported = info is not None and info.imported  # a release without b = 1 rows (docs/IMPORT.md)
        if reference and 1.0 not in {b for _, b in reference} and not imported:
            file, row = _first_row(con, run_id)
            problems.append(Problem(files[file], row, f"run {run_id!r} has no budget 1.0 (full-cache audit) arm"))
    return problems


def _first_row(con, run_id: str) -> tuple[int, int]:
    """``(_file, _row)`` of the run's first outcome row (read only when a problem names it)."""
    return first_row(one(con, f"SELECT {FIRST} FROM outcomes WHERE run_id = $r", {"r": run_id})[0])


def _cells_diff(got, reference) -> str:
    missing = sorted(set(reference) - set(got))
    extra = sorted(set(got) - set(reference))
    text = f"{len(got)} arms vs {len(reference)}"
    if missing:
        text += f"; missing {missing[:10]}" + (" …" if len(missing) > 10 else "")
    if extra:
        text += f"; extra {extra[:10]}" + (" …" if len(extra) > 10 else "")
    return text


def _exact_grid(con, reference, source, run_id, files) -> list[Problem]:
    """Exact evictor-set and budget-grid comparison for the (few) inputs whose signature
    differs (``_odd_rows`` without the later duplicates of ``_later__odd_rows``)."""
    problems: list[Problem] = []
    ref_evictors = sorted({e for e, _ in reference})
    ref_budgets = {e: sorted(b for e2, b in reference if e2 == e) for e in ref_evictors}
    con.execute("CREATE OR REPLACE TEMP VIEW _odd_rows_kept AS SELECT * FROM _odd_rows "
                "ANTI JOIN _later__odd_rows USING (_file, _row)")

    def evictor_detail(rec):
        got = list(rec["_evictors"])
        missing, extra = sorted(set(ref_evictors) - set(got)), sorted(set(got) - set(ref_evictors))
        return (f"input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; {source} evictor set is "
                f"{ref_evictors}" + (f"; missing {missing}" if missing else "") + (f"; extra {extra}" if extra else ""))

    problems += emit(con, f"""SELECT {FIRST_ROW}, * FROM (
        SELECT {_KEY}, {FIRST} AS _first, list_sort(list_distinct(list(evictor))) AS _evictors
        FROM _odd_rows_kept GROUP BY {_KEY}) WHERE _evictors != $ref""", files,
                     f"evictor set differs between inputs of run {run_id!r}", evictor_detail, {"ref": ref_evictors})
    grids = pl.DataFrame({"evictor": ref_evictors, "_ref": [ref_budgets[e] for e in ref_evictors]},
                         schema={"evictor": pl.String, "_ref": pl.List(pl.Float64)})
    con.register("_ref_grid", grids)

    def grid_detail(rec):
        got, ref = list(rec["_grid"]), list(rec["_ref"])
        missing, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
        return (f"evictor {rec['evictor']!r} of input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; "
                f"{source} budget grid is {ref}" + (f"; missing {missing}" if missing else "")
                + (f"; extra {extra}" if extra else ""))

    try:
        problems += emit(con, f"""SELECT {FIRST_ROW}, * FROM (
            SELECT {_KEY}, evictor, {FIRST} AS _first, list_sort(list(budget)) AS _grid
            FROM _odd_rows_kept SEMI JOIN _ref_grid USING (evictor) GROUP BY {_KEY}, evictor)
            JOIN _ref_grid USING (evictor) WHERE _grid != _ref""", files,
                         f"budget grid differs between arms of run {run_id!r}", grid_detail)
    finally:
        con.unregister("_ref_grid")
    return problems

