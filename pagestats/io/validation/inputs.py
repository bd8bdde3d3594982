"""Row rules of the ``inputs`` table (docs/SCHEMA.md): scores, drop, profile lengths and values.

``full_score`` in [0, 1]; ``drop`` finite; one ``draw`` per run (the manifest's, when it
has one); ``run_id`` and ``task`` non-empty and
without ``/`` (so that an exclusion can name them); ``n_tokens`` ≥ 1; ``model``,
``context_length`` and ``task`` agreeing with the run's manifest; ``agreement`` length =
manifest ``n_layers`` (else consistent within the run) and ≥ 2; ``pair_jaccard`` length
= L·H(H−1)/2; profile values in [0, 1]; ``agreement`` = the per-layer mean of
``pair_jaccard`` within :data:`AGREEMENT_TOLERANCE`; logged ``drop`` =
:func:`pagestats.profile.drop_from_agreement` (manifest bins) within
:data:`DROP_TOLERANCE`.

The rules run on the relation ``inp`` of a DuckDB connection (the inputs without later
duplicates). One aggregate over ``inp`` grouped by (run_id, task, model, context_length,
draw, L, P) — a few rows per run — yields the per-run references (modes) and every count;
the bad rows are fetched only for the rules that fire. The two rules that need the whole
profile (agreement vs pair Jaccards, and the recomputed drop of Eq. 3) stream the lists
through NumPy in record batches.

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), App. F (deployed bins). docs/SCHEMA.md (schema, reader rules).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa

from pagestats import defaults, profile
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import (
    Collector,
    Problem,
    emit,
    first_row,
    mode,
    null_problems,
    one,
    out_of_range,
    value_text,
)

#: Tolerance of the logged-vs-recomputed drop check (float32 agreement → float64 D).
DROP_TOLERANCE = 1e-6
#: Largest |a_ℓ − mean of layer ℓ's pair Jaccards| accepted. The collector logs both as float32 roundings
#: of one float64 computation (§3: a_ℓ is the mean pairwise Jaccard of the layer's heads), so they agree
#: to float32 precision (≤ 6e-8 on the shipped logs).
AGREEMENT_TOLERANCE = 1e-6
#: Inputs per record batch of the scan (bounds memory: the profile lists of one batch at a time).
_BATCH = 32_768

#: Range rules counted in the summary: (name, SQL condition on ``inp``, rule, detail column).
_RANGE_RULES = (
    ("full_score", out_of_range("full_score", 0.0, 1.0), "full_score outside [0, 1] or NaN", "full_score"),
    ("drop", '("drop" IS NOT NULL AND NOT isfinite("drop"))', "drop is NaN or infinite", "drop"),
    ("n_tokens", "n_tokens < 1", "n_tokens < 1", "n_tokens"),
)


def _values_bad(col: str) -> str:
    return f"(len({col}) > 0 AND (NOT isfinite(list_sum({col})) OR list_min({col}) < 0 OR list_max({col}) > 1))"


#: Rules on the summary columns (joined with the per-run reference ``_ref``): (SQL condition,
#: rule, detail).
_SUMMARY_RULES = (
    ("_model IS NOT NULL AND model != _model", "model differs from the manifest",
     lambda r: f"model {value_text(r['model'])} but the manifest says {value_text(r['_model'])}"),
    ("_context_length IS NOT NULL AND context_length != _context_length", "context_length differs from the manifest",
     lambda r: f"context_length {value_text(r['context_length'])} but the manifest says "
               f"{value_text(r['_context_length'])}"),
    ("draw != _ref_draw", "draw differs within the run",
     lambda r: f"draw {r['draw']} but {r['_ref_src']} draw is {r['_ref_draw']}"),
)
_LENGTH_RULES = (
    ("_L != _L_exp", "agreement length differs from the number of layers",
     lambda r: f"{r['_L']} layers; {r['_L_src']} {r['_L_exp']}"),
    ("_L < 2", "agreement has fewer than 2 layers", None),
    ("_n_heads IS NOT NULL AND _P != _L_exp * _n_heads * (_n_heads - 1) // 2",
     "pair_jaccard length differs from L·H(H−1)/2",
     lambda r: f"length {r['_P']}; expected L·H(H−1)/2 = {value_text(r['_P_exp'])} (L = {value_text(r['_L_exp'])}, "
               f"H = {r['_n_heads']})"),
    ("_n_heads IS NULL AND _P != _P_ref", "pair_jaccard length inconsistent within the run",
     lambda r: f"length {r['_P']}; the run's other inputs have {r['_P_ref']}"),
)


#: Columns the per-run summary groups by.
_GROUP = ("run_id", "task", "model", "context_length", "draw", "_L", "_P")


def _check_inputs(con, files, runs, nulls=(), listed=None) -> list[Problem]:
    """The rules of this module on ``inp``, in one streamed scan of the table; with ``nulls``
    (:func:`~pagestats.io.validation.problems.null_checks` of ``inputs``, when ``inp`` is
    all of ``inputs``) the null rules are counted in the same scan and reported first.

    ``listed`` (run_id → tasks) names the tasks of runs read whole that must have inputs: a
    task of the manifest's ``tasks`` with no row is reported at the manifest. A task with more
    inputs of one draw than the manifest's ``n_per_task`` is reported there too."""
    problems: list[Problem] = []
    flags = [f"({cond}) AS _c_{name}" for name, cond, _, _ in _RANGE_RULES]
    flags += [f"{_values_bad(c)} AS _c_{c}" for c in ("agreement", "pair_jaccard")]
    flags += [f"({cond}) AS _null_{i}" for i, (cond, _, _) in enumerate(nulls)]
    reader = con.sql(
        'SELECT _file, _row, run_id, task, model, context_length, draw, "drop", len(agreement) AS _L, '
        f"len(pair_jaccard) AS _P, {', '.join(flags)}, agreement, pair_jaccard FROM inp"
    ).to_arrow_reader(_BATCH)
    profiles = _Profiles(runs)
    parts = []
    for batch in reader:
        meta = pl.from_arrow(batch.drop_columns(["agreement", "pair_jaccard"]))
        part = (meta.group_by(_GROUP).agg(
            pl.len().alias("n"), (pl.col("_file").cast(pl.Int64) * 2**32 + pl.col("_row")).min().alias("_first"),
            pl.col("^_c_.*$", "^_null_.*$").sum()))
        # a copy: the group keys would otherwise keep the whole batch's string buffers alive
        parts.append(pl.DataFrame(part.to_dict(as_series=False), schema=part.schema))
        profiles.update(batch, meta)
    if not parts:
        return []
    summary = pl.concat(parts).group_by(_GROUP).agg(
        pl.col("n").sum(), pl.col("_first").min(), pl.col("^_c_.*$", "^_null_.*$").sum())
    problems += _task_counts(summary, runs, listed or {})
    totals = summary.select(pl.col("^_c_.*$", "^_null_.*$").sum()).row(0, named=True)
    problems += null_problems(con, "inputs", nulls, [totals[f"_null_{i}"] for i in range(len(nulls))], files)

    for name, cond, rule, col in _RANGE_RULES[:2]:
        if totals[f"_c_{name}"]:
            problems += emit(con, f'SELECT _file, _row, "{col}" AS v FROM inp WHERE {cond}', files, rule,
                             lambda r, c=col: f"{c} = {value_text(r['v'])}")
    for name in ("run_id", "task"):  # an exclusion RUN_ID/TASK/INPUT_ID could not name them
        bad = summary.filter(pl.col(name).str.contains("/", literal=True) | (pl.col(name) == ""))
        found = Collector()
        for value, first, n in bad.group_by(name).agg(pl.col("_first").min(), pl.col("n").sum()).iter_rows():
            found.add(*first_row(first), f"{name} = '{value}' ({n} inputs)")
        problems += found.problems(files, f"{name} is empty or contains '/' (it could not be named in --exclude)")
    name, cond, rule, col = _RANGE_RULES[2]
    if totals[f"_c_{name}"]:
        problems += emit(con, f"SELECT _file, _row, {col} AS v FROM inp WHERE {cond}", files, rule,
                         lambda r: f"{col} = {value_text(r['v'])}")

    ref = _references(summary, runs)
    con.register("_sum", summary)
    con.register("_ref", ref)
    try:
        con.execute("CREATE OR REPLACE TEMP VIEW _sum_x AS SELECT * FROM _sum LEFT JOIN _ref USING (run_id)")
        con.execute(
            "CREATE OR REPLACE TEMP VIEW _inp_x AS SELECT _file, _row, run_id, task, model, context_length, draw, "
            "len(agreement) AS _L, len(pair_jaccard) AS _P, _ref.* EXCLUDE (run_id), "
            "_L_exp * _n_heads * (_n_heads - 1) // 2 AS _P_exp FROM inp LEFT JOIN _ref USING (run_id)"
        )

        def rules(table):
            out = []
            for cond, rule, detail in table:
                if one(con, f"SELECT count(*) FROM _sum_x WHERE {cond}")[0]:
                    out += emit(con, f"SELECT * FROM _inp_x WHERE {cond}", files, rule, detail)
            return out

        problems += rules(_SUMMARY_RULES)
        for run_id, info in runs.items():
            if info.tasks is None:
                continue
            bad = summary.filter((pl.col("run_id") == run_id) & ~pl.col("task").is_in(list(info.tasks)))
            found = Collector()
            for task, first, n in bad.group_by("task").agg(pl.col("_first").min(), pl.col("n").sum()).iter_rows():
                found.add(*first_row(first), f"task {task} ({n} inputs)")
            problems += found.problems(files, f"task not in the manifest tasks of run {run_id!r}")
        problems += rules(_LENGTH_RULES)
        problems += _triangular_rule(summary, ref, files)
    finally:
        con.execute("DROP VIEW IF EXISTS _inp_x")
        con.execute("DROP VIEW IF EXISTS _sum_x")
        con.unregister("_sum")
        con.unregister("_ref")

    # profile values are Jaccards: finite and in [0, 1]
    for col in ("agreement", "pair_jaccard"):
        if totals[f"_c_{col}"]:
            problems += emit(con, f"SELECT _file, _row FROM inp WHERE {_values_bad(col)}", files,
                             f"{col} has values outside [0, 1] or NaN")
    problems += profiles.problems(files)
    return problems


def _task_counts(summary: pl.DataFrame, runs, listed) -> list[Problem]:
    """The manifest's tasks against the tasks the rows hold: every listed task has inputs, and
    none has more inputs of one draw than ``n_per_task``."""
    problems = []
    counts = summary.group_by("run_id", "task", "draw").agg(pl.col("n").sum())
    for run_id, tasks in sorted(listed.items()):
        info = runs.get(run_id)
        have = set(counts.filter(pl.col("run_id") == run_id)["task"].to_list())
        for task in sorted(set(tasks) - have):
            problems.append(Problem(info.manifest_path, None, f"manifest tasks lists {task!r}, but the run has no "
                                                              "inputs of it"))
    for run_id, task, draw, n in counts.sort("run_id", "task", "draw").iter_rows():
        info = runs.get(run_id)
        if info is not None and info.n_per_task is not None and n > info.n_per_task:
            problems.append(Problem(info.manifest_path, None, f"task {task!r} has {n} inputs of draw {draw}, more than "
                                                              f"the manifest's n_per_task {info.n_per_task}"))
    return problems


def _references(summary: pl.DataFrame, runs) -> pl.DataFrame:
    """Per run: the manifest's values and the references the rules compare with (the
    manifest's draw / n_layers, else the run's most common; the run's most common
    pair_jaccard length where the manifest has no n_heads)."""
    manifest = _run_frame(runs)
    rows = []
    for (run_id,), sub in summary.group_by("run_id", maintain_order=True):
        info = runs.get(run_id)
        draws = {}
        for d, n in sub.filter(pl.col("draw").is_not_null()).group_by("draw").agg(pl.col("n").sum()).iter_rows():
            draws[d] = n
        lengths = dict(sub.group_by("_L").agg(pl.col("n").sum()).iter_rows())
        L_ref = mode(lengths)
        n_layers = info.n_layers if info is not None else None
        n_heads = info.n_heads if info is not None else None
        manifest_draw = info.draw if info is not None else None
        pairs = dict(sub.group_by("_P").agg(pl.col("n").sum()).iter_rows()) if n_heads is None else {}
        rows.append({
            "run_id": run_id,
            "_ref_draw": manifest_draw if manifest_draw is not None else (mode(draws) if draws else None),
            "_ref_src": "the manifest's" if manifest_draw is not None else "the run's usual",
            "_L_ref": L_ref,
            "_L_exp": n_layers if n_layers is not None else L_ref,
            "_L_src": "manifest model.n_layers" if n_layers is not None else "the run's other inputs have",
            "_P_ref": mode(pairs) if pairs else None,
        })
    ref = pl.DataFrame(rows, schema={"run_id": pl.String, "_ref_draw": pl.Int64, "_ref_src": pl.String,
                                     "_L_ref": pl.Int64, "_L_exp": pl.Int64, "_L_src": pl.String, "_P_ref": pl.Int64})
    return ref.join(manifest.select("run_id", "_n_heads", "_model", "_context_length"), on="run_id", how="left")


def _triangular_rule(summary: pl.DataFrame, ref: pl.DataFrame, files) -> list[Problem]:
    """Where the manifest gives no n_heads: the run's usual pair_jaccard length is L·H(H−1)/2 for some H."""
    problems = []
    for rec in ref.filter(pl.col("_n_heads").is_null() & pl.col("_P_ref").is_not_null()).iter_rows(named=True):
        L, P = rec["_L_ref"], rec["_P_ref"]
        if L and (P % L or not _triangular(P // L)):
            first = summary.filter((pl.col("run_id") == rec["run_id"]) & (pl.col("_P") == P))["_first"].min()
            file, row = first_row(first)
            problems.append(Problem(files[file], row,
                                    f"pair_jaccard length {P} is not L·H(H−1)/2 for L = {L} and any H"))
    return problems


def _triangular(p: int) -> bool:
    h = int(round((1 + math.sqrt(1 + 8 * p)) / 2))
    return h >= 2 and h * (h - 1) // 2 == p


def _rows(lists: pa.ListArray, idx: np.ndarray, width: int) -> np.ndarray:
    """Lists ``idx`` (all of length ``width``) as a matrix of their float32 values (a null
    element is NaN); reductions over it accumulate in float64. Converted through polars:
    pyarrow's own ``to_numpy`` imports pandas (0.3–0.45 s of a cold validation at 1M inputs)."""
    rows = pl.Series(lists)
    if len(idx) < len(rows):
        rows = rows.gather(idx)
    return rows.explode().to_numpy().reshape(len(idx), width)


def _pairs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
    """The distinct pairs (a[i], b[i])."""
    keys = np.unique(a.astype(np.int64) * 2**32 + b.astype(np.int64))
    return [(int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys]


class _Profiles:
    """Two rules on whole profiles, fed the record batches of the scan of ``inp`` (NumPy):

    * ``agreement`` equals the per-layer mean of ``pair_jaccard`` (§3, Eq. 3), where both are
      logged (rows whose list lengths do not split into L layers are reported by the length
      rules; NaN or out-of-range values by the range rule, so a NaN difference is not
      reported twice);
    * logged ``drop`` against :func:`pagestats.profile.drop_from_agreement` (Eq. 3), with the
      bins of the run's manifest.
    """

    def __init__(self, runs):
        self.settings = [(defaults.BIN_FRACTION, defaults.BIN_CONVENTION)]  # 0: runs without a manifest
        for info in runs.values():
            if (info.bin_fraction, info.convention) not in self.settings:
                self.settings.append((info.bin_fraction, info.convention))
        self.setting_of = {run_id: self.settings.index((info.bin_fraction, info.convention))
                           for run_id, info in runs.items()}
        self.pairs_bad, self.drop_bad, self.cannot = Collector(), {}, {}

    def update(self, batch: pa.RecordBatch, meta: pl.DataFrame) -> None:
        L_col, P_col = meta["_L"].fill_null(0).to_numpy(), meta["_P"].fill_null(0).to_numpy()
        files, rows = meta["_file"].to_numpy(), meta["_row"].to_numpy()
        pair_ok = (L_col >= 1) & (P_col > 0) & (P_col % np.maximum(L_col, 1) == 0)
        for n_layers, n_pairs in _pairs(L_col[pair_ok], P_col[pair_ok]):
            idx = np.flatnonzero(pair_ok & (L_col == n_layers) & (P_col == n_pairs))
            a = _rows(batch.column("agreement"), idx, n_layers)
            j = _rows(batch.column("pair_jaccard"), idx, n_pairs)
            means = j.reshape(len(idx), n_layers, n_pairs // n_layers).mean(axis=-1, dtype=np.float64)
            err = np.abs(means - a).max(axis=-1)
            for i in np.flatnonzero(err > AGREEMENT_TOLERANCE):
                self.pairs_bad.add(int(files[idx[i]]), int(rows[idx[i]]), f"max |a_ℓ − mean pair Jaccard| = {err[i]:.3g}")
        drop = meta["drop"].fill_null(np.nan).to_numpy()
        setting = (meta["run_id"].replace_strict(list(self.setting_of), list(self.setting_of.values()), default=0,
                                                 return_dtype=pl.Int64).to_numpy()
                   if self.setting_of else np.zeros(meta.height, dtype=np.int64))
        usable = np.isfinite(drop) & (L_col >= 2)
        for s_id, n_layers in _pairs(setting[usable], L_col[usable]):
            fraction, convention = self.settings[s_id]
            idx = np.flatnonzero(usable & (setting == s_id) & (L_col == n_layers))
            key = (s_id, n_layers)
            if key in self.cannot:
                first = min(zip(files[idx].tolist(), rows[idx].tolist()))
                self.cannot[key] = (min(first, self.cannot[key][0]), self.cannot[key][1])
                continue
            try:
                recomputed = profile.drop_from_agreement(_rows(batch.column("agreement"), idx, n_layers), fraction,
                                                         convention)
            except ValueError as err:
                self.cannot[key] = (min(zip(files[idx].tolist(), rows[idx].tolist())), str(err))
                continue
            diff = np.abs(recomputed - drop[idx])
            for i in np.flatnonzero(diff > DROP_TOLERANCE):  # NaN agreement is reported by the range check
                r = int(idx[i])
                self.drop_bad.setdefault((fraction, convention), Collector()).add(
                    int(files[r]), int(rows[r]),
                    f"logged {value_text(float(drop[r]))} but agreement gives {value_text(float(recomputed[i]))}")

    def problems(self, files) -> list[Problem]:
        pairs_bad, drop_bad, cannot = self.pairs_bad, self.drop_bad, self.cannot
        problems = pairs_bad.problems(files, "agreement differs from the layer means of pair_jaccard")
        for (fraction, convention), found in drop_bad.items():
            problems += found.problems(files, f"drop disagrees with drop_from_agreement(agreement, bins={fraction:.6g}, "
                                              f"{convention}) by more than {DROP_TOLERANCE:g}")
        for (file, row), message in sorted(cannot.values()):
            problems.append(Problem(files[file], row, f"cannot compute drop: {message}"))
        return problems
