"""Row rules of the ``inputs`` table (docs/SCHEMA.md): scores, drop, profile lengths and values.

``full_score`` in [0, 1]; ``drop`` finite; one ``draw`` per run (the manifest's, when it
has one); ``run_id`` and ``task`` non-empty and
without ``/`` (so that an exclusion can name them); ``n_tokens`` ≥ 1; ``model``,
``context_length`` and ``task`` agreeing with the run's manifest; ``agreement`` length =
manifest ``n_layers`` (else consistent within the run) and ≥ 2; ``pair_jaccard`` length
= L·H(H−1)/2; profile values in [0, 1]; ``agreement`` = the per-layer mean of
``pair_jaccard`` within :data:`AGREEMENT_TOLERANCE`; logged ``drop`` =
:func:`pagestats.core.profile.drop_from_agreement` (manifest bins) within
:data:`DROP_TOLERANCE`.

The rules run on the relation ``inp`` of a DuckDB connection (the inputs without later
duplicates). One aggregate over ``inp`` grouped by (run_id, task, model, context_length,
draw, L, P) — a few rows per run — yields the per-run references (modes) and every count;
the bad rows are fetched only for the rules that fire. The rules that read every value of the
profile lists (null elements, values in [0, 1], agreement vs pair Jaccards, and the recomputed
drop of Eq. 3) run in NumPy on the Arrow buffers of the lists, streamed once in record batches
(DuckDB's list aggregates took three times as long at 1M inputs; docs/PERFORMANCE.md, "The first
calls on a new release").

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), App. F (deployed bins). docs/SCHEMA.md (schema, reader rules).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa

from pagestats.core import defaults, profile
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import (
    Collector,
    Problem,
    emit,
    first_row,
    mode,
    null_elements,
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
#: The profile list columns whose values the scan streams to NumPy.
_LISTS = ("agreement", "pair_jaccard")

#: Range rules counted in the summary: (name, SQL condition on ``inp``, rule, detail column).
_RANGE_RULES = (
    ("full_score", out_of_range("full_score", 0.0, 1.0), "full_score outside [0, 1] or NaN", "full_score"),
    ("drop", '("drop" IS NOT NULL AND NOT isfinite("drop"))', "drop is NaN or infinite", "drop"),
    ("n_tokens", "n_tokens < 1", "n_tokens < 1", "n_tokens"),
)


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
    holes = {i: c for i, (cond, _, _) in enumerate(nulls) for c in _LISTS if cond == null_elements(c)}
    flags = [f"({cond}) AS _c_{name}" for name, cond, _, _ in _RANGE_RULES]
    flags += [f"({cond}) AS _null_{i}" for i, (cond, _, _) in enumerate(nulls) if i not in holes]
    reader = con.sql(
        'SELECT _file, _row, run_id, task, model, context_length, draw, "drop", len(agreement) AS _L, '
        f"len(pair_jaccard) AS _P, {', '.join(flags)}, agreement::FLOAT[] AS agreement, "
        "pair_jaccard::FLOAT[] AS pair_jaccard FROM inp"
    ).to_arrow_reader(_BATCH)
    profiles = _Profiles(runs, {c: nulls[i][2][1] for i, c in holes.items()})
    parts = []
    for batch in reader:
        meta = pl.from_arrow(batch.drop_columns(list(_LISTS)))
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
    for i, check in enumerate(nulls):  # in the order of the checks
        if i in holes:
            problems += profiles.holes[holes[i]].problems(files, check[1])
        else:
            problems += null_problems(con, "inputs", [check], [totals[f"_null_{i}"]], files)

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
    for col in _LISTS:
        problems += profiles.values_bad[col].problems(files, f"{col} has values outside [0, 1] or NaN")
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


class _Lists:
    """One list column of a record batch as NumPy views of its Arrow buffers (no copy but the
    null elements, read as NaN): ``offsets`` (one more than rows), ``values``, ``null_lists``
    (per row) and ``null_values`` (per element; ``None`` when there is none). Read from the
    buffers: pyarrow's own ``to_numpy`` imports pandas (0.3–0.45 s of a cold validation)."""

    def __init__(self, lists: pa.Array):
        if not (pa.types.is_list(lists.type) or pa.types.is_large_list(lists.type)) \
                or lists.type.value_type != pa.float32():
            raise TypeError(f"expected a list of float32, got {lists.type}")
        n, start = len(lists), lists.offset
        index = np.int64 if pa.types.is_large_list(lists.type) else np.int32
        self.offsets = np.frombuffer(lists.buffers()[1], dtype=index, count=start + n + 1)[start:].astype(np.int64)
        self.null_lists = _nulls(lists.buffers()[0], start, n) if lists.null_count else np.zeros(n, dtype=bool)
        values = lists.values
        end = int(self.offsets[-1]) if n else 0
        data = values.buffers()[1]
        self.values = (np.frombuffer(data, dtype=np.float32, count=values.offset + end)[values.offset:] if end
                       else np.empty(0, dtype=np.float32))  # every list null or empty: there may be no buffer
        self.null_values = None
        if values.null_count:
            self.null_values = _nulls(values.buffers()[0], values.offset, end)
            self.values = np.where(self.null_values, np.float32(np.nan), self.values)
        self.lengths = np.diff(self.offsets)

    def count(self, flags: np.ndarray) -> np.ndarray:
        """Per row, how many of its elements ``flags`` (one per value) marks."""
        total = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
        return total[self.offsets[1:]] - total[self.offsets[:-1]]

    def any(self, flags: np.ndarray) -> np.ndarray:
        """Per row, whether ``flags`` (one per value) marks any of its elements."""
        n = len(self.lengths)
        if n and self.lengths[0] > 0 and (self.lengths == self.lengths[0]).all():  # a matrix
            return flags[self.offsets[0]:self.offsets[-1]].reshape(n, -1).any(axis=1)
        return self.count(flags) > 0

    def matrix(self, idx: np.ndarray, width: int) -> np.ndarray:
        """Rows ``idx`` (all of length ``width``) as a ``(len(idx), width)`` float32 matrix."""
        if len(idx) == len(self.lengths):  # every row: the values are contiguous
            start = self.offsets[0]
            return self.values[start:start + len(idx) * width].reshape(len(idx), width)
        return self.values[self.offsets[idx][:, None] + np.arange(width)]


def _nulls(bitmap, offset: int, n: int) -> np.ndarray:
    """Where an Arrow validity bitmap marks nulls, as bools (``n`` from bit ``offset``)."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little", count=offset + n)
    return bits[offset:] == 0


def _pairs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
    """The distinct pairs (a[i], b[i])."""
    keys = np.unique(a.astype(np.int64) * 2**32 + b.astype(np.int64))
    return [(int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys]


def _layer_means(j: np.ndarray, n_layers: int) -> np.ndarray:
    """Per row and layer, the float64 mean of the layer's block of ``j`` (rows × L·P/L, layer-major),
    summed in the order of NumPy's ``mean(axis=-1, dtype=float64)`` (the same bits)."""
    blocks = j.reshape(len(j), n_layers, j.shape[1] // n_layers)
    total = blocks[..., 0].astype(np.float64)
    for k in range(1, blocks.shape[-1]):
        total += blocks[..., k]
    return total / blocks.shape[-1]


class _Profiles:
    """The rules on every value of the profile lists, fed the record batches of the scan of
    ``inp`` (NumPy):

    * no null element in ``agreement`` or ``pair_jaccard`` (``holes``: the null rules of
      :func:`~pagestats.io.validation.problems.null_checks` passed in, by column);
    * every value finite and in [0, 1] (``values_bad``, by column);
    * ``agreement`` equals the per-layer mean of ``pair_jaccard`` (§3, Eq. 3), where both are
      logged (rows whose list lengths do not split into L layers are reported by the length
      rules; NaN or out-of-range values by the range rule, so a NaN difference is not
      reported twice);
    * logged ``drop`` against :func:`pagestats.core.profile.drop_from_agreement` (Eq. 3), with the
      bins of the run's manifest.
    """

    def __init__(self, runs, holes=None):
        self.settings = [(defaults.BIN_FRACTION, defaults.BIN_CONVENTION)]  # 0: runs without a manifest
        for info in runs.values():
            if (info.bin_fraction, info.convention) not in self.settings:
                self.settings.append((info.bin_fraction, info.convention))
        self.setting_of = {run_id: self.settings.index((info.bin_fraction, info.convention))
                           for run_id, info in runs.items()}
        self.hole_text = dict(holes or {})  # column → detail of its null-element rule
        self.holes = {c: Collector() for c in self.hole_text}
        self.values_bad = {c: Collector() for c in _LISTS}
        self.pairs_bad, self.drop_bad, self.cannot = Collector(), {}, {}

    def update(self, batch: pa.RecordBatch, meta: pl.DataFrame) -> None:
        L_col, P_col = meta["_L"].fill_null(0).to_numpy(), meta["_P"].fill_null(0).to_numpy()
        files, rows = meta["_file"].to_numpy(), meta["_row"].to_numpy()
        lists = {c: _Lists(batch.column(c)) for c in _LISTS}
        for col, found in lists.items():
            self._values(col, found, files, rows)
        pair_ok = (L_col >= 1) & (P_col > 0) & (P_col % np.maximum(L_col, 1) == 0)
        for n_layers, n_pairs in _pairs(L_col[pair_ok], P_col[pair_ok]):
            idx = np.flatnonzero(pair_ok & (L_col == n_layers) & (P_col == n_pairs))
            a = lists["agreement"].matrix(idx, n_layers)
            means = _layer_means(lists["pair_jaccard"].matrix(idx, n_pairs), n_layers)
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
                recomputed = profile.drop_from_agreement(lists["agreement"].matrix(idx, n_layers), fraction,
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

    def _values(self, col: str, lists: _Lists, files: np.ndarray, rows: np.ndarray) -> None:
        """The rows of ``col`` with a null element, and those with a value (not null) that is not
        a number in [0, 1]."""
        outside = ~((lists.values >= 0) & (lists.values <= 1))  # NaN too
        if lists.null_values is not None:  # read as NaN: a hole, not a bad value
            outside &= ~lists.null_values
            if col in self.holes:
                holes = lists.count(lists.null_values)
                for i in np.flatnonzero((holes > 0) & ~lists.null_lists):
                    self.holes[col].add(int(files[i]), int(rows[i]), self.hole_text[col](
                        {"_holes": int(holes[i]), "_len": int(lists.lengths[i])}))
        for i in np.flatnonzero(lists.any(outside) & ~lists.null_lists):
            self.values_bad[col].add(int(files[i]), int(rows[i]), None)

    def problems(self, files) -> list[Problem]:
        """The problems of the agreement and drop rules (the others are read by column)."""
        pairs_bad, drop_bad, cannot = self.pairs_bad, self.drop_bad, self.cannot
        problems = pairs_bad.problems(files, "agreement differs from the layer means of pair_jaccard")
        for (fraction, convention), found in drop_bad.items():
            problems += found.problems(files, f"drop disagrees with drop_from_agreement(agreement, bins={fraction:.6g}, "
                                              f"{convention}) by more than {DROP_TOLERANCE:g}")
        for (file, row), message in sorted(cannot.values()):
            problems.append(Problem(files[file], row, f"cannot compute drop: {message}"))
        return problems
