"""Row rules of the ``outcomes`` table (docs/SCHEMA.md): ranges, orphans, the budget grid, the audit arm.

``score`` in [0, 1]; ``budget`` in (0, 1]; outcomes without an input and inputs without
outcomes; ``n_kept`` in [1, n_tokens]; the budget-1.0 arm equal to the full-KV outcome
(score = full_score within :data:`SCORE_TOLERANCE`, n_kept = n_tokens); the same budget
grid for every (input, evictor) and the same evictor set for every input of a run (the
manifest's evictors × budgets, when it lists them), with no outcome row twice. Arms are
compared per input by a signature (count and sum of :data:`CELL_HASH`), exactly only
for the inputs whose signature differs.

References
----------
PAGE paper, §4 "Setup" (budgets, full-cache audit arm at b = 1). docs/SCHEMA.md (schema,
reader rules).
"""

from __future__ import annotations

import polars as pl

from pagestats import schema
from pagestats.io.validation.problems import Problem, _duplicates, _out_of_range, emit

#: Tolerance of the budget-1.0 vs full-KV score check.
SCORE_TOLERANCE = 1e-9


#: 32-bit hash of one (evictor, budget) arm; an input's arms are summarised by their count
#: and the sum of these (a set signature: equal sets give equal sums).
CELL_HASH = (pl.struct("evictor", "budget").hash() & 0xFFFFFFFF).alias("_cell")


def _cell_signature(evictors, budgets) -> tuple[int, int]:
    cells = pl.DataFrame(
        {"evictor": list(evictors), "budget": [float(b) for b in budgets]},
        schema={"evictor": pl.String, "budget": pl.Float64},
    )
    h = cells.select(CELL_HASH)["_cell"]
    return cells.height, int(h.sum())


def _check_outcomes(inp: pl.DataFrame, oc: pl.DataFrame, files, runs, incomplete, key) -> list[Problem]:
    problems: list[Problem] = []
    problems += _out_of_range(oc, "score", 0.0, 1.0, files, "score outside [0, 1] or NaN")
    problems += _out_of_range(oc, "budget", 0.0, 1.0, files, "budget outside (0, 1] or NaN", lo_open=True)

    ikey = list(schema.INPUT_KEY)
    # one numeric group-by over all outcome rows; identities are attached afterwards from
    # inputs (or, for the rare outcomes without an input, from their own first row)
    # (lazy with an explicit projection: the eager group-by is several times slower here)
    per_input = (
        oc.lazy()
        .select(*key, "_file", "_row", "n_kept", "evictor", "budget")
        .group_by(key)
        .agg(
            pl.col("_file").first(), pl.col("_row").first(), pl.len().alias("_n"),
            pl.col("n_kept").min().alias("_kmin"), pl.col("n_kept").max().alias("_kmax"),
            CELL_HASH.cast(pl.UInt64).sum().alias("_sig"),
        )
        .collect()
    )
    if key != ikey:
        known = per_input.join(inp.select(*key, *ikey), on=key, how="inner")
        unknown = per_input.join(inp.select(key), on=key, how="anti")
        if unknown.height:
            ids = oc.join(unknown.select("_file", "_row"), on=["_file", "_row"], how="semi").select("_file", "_row", *ikey)
            unknown = unknown.join(ids, on=["_file", "_row"], how="left")
            per_input = pl.concat([known, unknown.select(known.columns)])
        else:
            per_input = known

    # orphans both ways
    if "inputs" not in incomplete:
        orphans = per_input.join(inp.select(key), on=key, how="anti")
        orphans = orphans.with_columns(pl.format("input ({}, {}, {}) has {} outcome rows", *ikey, "_n").alias("_d"))
        problems += emit(orphans, files, "outcomes whose input is missing from inputs", "_d")
    if "outcomes" not in incomplete:
        lonely = inp.join(per_input.select(key), on=key, how="anti")
        problems += emit(lonely, files, "input with no outcomes")

    # n_kept in [1, n_tokens]: inputs whose extremes fall outside, then their rows
    sizes = inp.select(*key, "n_tokens", "full_score")
    cand = per_input.join(sizes, on=key, how="inner").filter(
        (pl.col("_kmin") < 1) | (pl.col("_kmax") > pl.col("n_tokens"))
    )
    if cand.height:
        rows = oc.join(cand.select(*key, "n_tokens"), on=key, how="inner")
        bad = rows.filter((pl.col("n_kept") < 1) | (pl.col("n_kept") > pl.col("n_tokens")))
        problems += emit(bad.with_columns(pl.format("n_kept = {}, n_tokens = {}", "n_kept", "n_tokens").alias("_d")),
                         files, "n_kept outside [1, n_tokens]", "_d")

    # the budget-1.0 arm reproduces the full-KV outcome (§4 "Setup": full-cache audit)
    full = (
        oc.lazy()
        .filter(pl.col("budget") == 1.0)
        .select("_file", "_row", *{*key, *ikey}, "evictor", "n_kept", "score")
        .join(sizes.lazy(), on=key, how="inner")
        .collect()
    )
    bad = full.filter(((pl.col("score") - pl.col("full_score")).abs() > SCORE_TOLERANCE)
                      | (pl.col("score").is_nan() != pl.col("full_score").is_nan())
                      | (pl.col("n_kept") != pl.col("n_tokens")))
    bad = bad.with_columns(pl.format("evictor {}: score {} vs full_score {}, n_kept {} vs n_tokens {}", "evictor",
                                     "score", "full_score", "n_kept", "n_tokens").alias("_d"))
    problems += emit(bad, files, "budget 1.0 outcome differs from the full-KV outcome", "_d")

    problems += _check_grid(oc, per_input, files, runs, key)
    return problems


def _check_grid(oc: pl.DataFrame, per_input: pl.DataFrame, files, runs, key) -> list[Problem]:
    """Every (input, evictor) of a run has the same budget grid and every input the same
    evictor set (and no outcome row twice): the manifest's evictors × budgets when it
    lists them, else the run's most common set of arms."""
    problems: list[Problem] = []
    for run_id in sorted(per_input["run_id"].unique().drop_nulls().to_list()):
        sub = per_input.filter(pl.col("run_id") == run_id)
        usual_n, usual_sig = sub.group_by("_n", "_sig").len().sort(["len", "_n"], descending=[True, False]).row(0)[:2]
        one = sub.filter((pl.col("_n") == usual_n) & (pl.col("_sig") == usual_sig)).select(key).head(1)
        usual = oc.join(one, on=key, how="semi").select("evictor", "budget").unique()
        usual_cells = sorted(usual.iter_rows())
        info = runs.get(run_id)
        first = sub.sort("_file", "_row").head(1)
        if info is not None and info.evictors is not None and info.budgets is not None:
            manifest_cells = sorted((e, b) for e in info.evictors for b in info.budgets)
            if set(manifest_cells) != set(usual_cells):
                # reported once for the run; inputs are then compared with the run's usual arms
                problems += emit(first, files, f"the usual arms of run {run_id!r} differ from the manifest's evictors × "
                                               f"budgets", lambda rec: _cells_diff(usual_cells, manifest_cells))
                reference, source = usual_cells, "the run's usual"
            else:
                reference, source = manifest_cells, "the manifest's"
        else:
            reference, source = usual_cells, "the run's usual"
        ref_n, ref_sig = _cell_signature(*zip(*reference)) if reference else (0, 0)
        odd = sub.filter((pl.col("_n") != ref_n) | (pl.col("_sig") != ref_sig))
        if odd.height:
            rows = oc.join(odd.select(key), on=key, how="semi")
            p, rows = _duplicates(rows, schema.OUTCOME_KEY, files, "outcome row")
            problems += p
            problems += _exact_grid(rows, reference, source, run_id, files)
        if reference and 1.0 not in {b for _, b in reference}:
            problems += emit(first, files, f"run {run_id!r} has no budget 1.0 (full-cache audit) arm")
    return problems


def _cells_diff(got, reference) -> str:
    missing = sorted(set(reference) - set(got))
    extra = sorted(set(got) - set(reference))
    text = f"{len(got)} arms vs {len(reference)}"
    if missing:
        text += f"; missing {missing[:10]}" + (" …" if len(missing) > 10 else "")
    if extra:
        text += f"; extra {extra[:10]}" + (" …" if len(extra) > 10 else "")
    return text


def _exact_grid(rows: pl.DataFrame, reference, source, run_id, files) -> list[Problem]:
    """Exact evictor-set and budget-grid comparison for the (few) inputs whose signature differs."""
    problems: list[Problem] = []
    ikey = list(schema.INPUT_KEY)
    ref_evictors = sorted({e for e, _ in reference})
    ref_budgets = {e: sorted(b for e2, b in reference if e2 == e) for e in ref_evictors}
    per_input = rows.group_by(ikey).agg(
        pl.col("_file").first(), pl.col("_row").first(), pl.col("evictor").unique().sort().alias("_evictors")
    )
    bad = per_input.filter(pl.col("_evictors") != pl.lit(pl.Series([ref_evictors], dtype=pl.List(pl.String))))

    def evictor_detail(rec):
        got = list(rec["_evictors"])
        missing, extra = sorted(set(ref_evictors) - set(got)), sorted(set(got) - set(ref_evictors))
        return (f"input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; {source} evictor set is "
                f"{ref_evictors}" + (f"; missing {missing}" if missing else "") + (f"; extra {extra}" if extra else ""))

    problems += emit(bad, files, f"evictor set differs between inputs of run {run_id!r}", evictor_detail)
    grids = rows.filter(pl.col("evictor").is_in(ref_evictors)).group_by(*ikey, "evictor").agg(
        pl.col("_file").first(), pl.col("_row").first(), pl.col("budget").sort().alias("_grid")
    )
    grids = grids.with_columns(
        pl.col("evictor").replace_strict(
            ref_evictors, [ref_budgets[e] for e in ref_evictors], return_dtype=pl.List(pl.Float64)
        ).alias("_ref")
    )
    bad = grids.filter(pl.col("_grid") != pl.col("_ref"))

    def grid_detail(rec):
        got, ref = list(rec["_grid"]), list(rec["_ref"])
        missing, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
        return (f"evictor {rec['evictor']!r} of input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; "
                f"{source} budget grid is {ref}" + (f"; missing {missing}" if missing else "")
                + (f"; extra {extra}" if extra else ""))

    problems += emit(bad, files, f"budget grid differs between arms of run {run_id!r}", grid_detail)
    return problems
