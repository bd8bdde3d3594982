"""The what-if table of ``pagestats whatif``: the gate replayed under any policy and profile
spec, one row per (model, context_length, evictor, task, budget), computed by one DuckDB query
over the relations of a :class:`pagestats.replay.Replay`, in memory or out of core.

References
----------
PAGE paper, §3 (Eq. 2); §4 (Table 2 matrix cells); Table 27 (harm rate); App. A.3.4–A.3.5
(the what-ifs: τ, z-scored and midpoint thresholds, layer / head-pair / k subsampling).
"""

from __future__ import annotations

import polars as pl

from pagestats.core import formulas
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL, WHATIF_CELL
from pagestats.replay import FixedTau, Policy, ProfileSpec, Replay, relations
from pagestats.core.schema import INPUT_KEY
from pagestats.core.escape import csv_frame
from pathlib import Path

WHATIF_COLUMNS = (
    "model",
    "context_length",
    "evictor",
    "task",
    "budget",
    "n_inputs",
    "acc_full",
    "acc_plain",
    "acc_gated",
    "delta",
    "harm_plain",
    "harm_gated",
    "p_open",
    "kept_kv",
    "degenerate",
)
#: Columns that do not depend on the gate: with head-pair draws they are taken from draw 0
#: (every draw holds the same rows), so they equal the draw-free values.
GATE_FREE = ("n_inputs", "acc_full", "acc_plain", "harm_plain")


def whatif_query(draw_columns: list[str], input_draws: str | int | None = None, *, tables: dict[str, str] | None = None) -> str:
    """The what-if as one DuckDB query over ``outcomes`` and ``decisions`` (one join), every aggregate a
    formula of :mod:`pagestats.core.formulas`.

    ``draw_columns``: the head-pair draw columns of ``decisions``. ``input_draws``: ``"split"`` adds the
    input draw (``inputs.draw``) to the cell keys, an integer keeps only that draw's inputs, ``None``
    pools whatever is there. ``tables`` renames the relations read (one run's, :func:`_run_by_run`).
    """
    return _over_draws(_per_draw(draw_columns, input_draws, tables), draw_columns, input_draws)


def _cell(input_draws) -> str:
    return ", ".join([*WHATIF_CELL, *(["draw"] if input_draws == "split" else [])])


def _per_draw(draw_columns: list[str], input_draws, tables: dict[str, str] | None = None) -> str:
    """Per cell (and head-pair draw): ``n_inputs`` and the means of :data:`WHATIF_COLUMNS`,
    each over the cell's outcome rows (so that cells of disjoint row sets pool as means
    weighted by ``n_inputs``)."""
    t = {"outcomes": "outcomes", "decisions": "decisions", "inputs": "inputs", "held_out": "held_out", **(tables or {})}
    cell = _cell(input_draws)
    key = ", ".join(INPUT_KEY)
    draw = ", ".join(draw_columns)
    gated = relations.gated_query(draw_columns, outcomes=t["outcomes"], decisions=t["decisions"], held_out=t["held_out"])
    acc = ", ".join(f"{sql} AS {name}" for name, sql in formulas.ACCURACY.items())
    draw_col = ", x.draw" if input_draws == "split" else ""
    draw_join = f" LEFT JOIN (SELECT {key}, draw FROM {t['inputs']}) x USING ({key})" if input_draws is not None else ""
    draw_where = f" WHERE x.draw = {int(input_draws)}" if isinstance(input_draws, int) else ""
    return f"""
        SELECT {cell}{", " + ", ".join(draw_columns) if draw_columns else ""}, count(*) AS n_inputs, {acc},
            {formulas.harm_count("score_plain")} / count(*) AS harm_plain,
            {formulas.harm_count("score_gated")} / count(*) AS harm_gated,
            {formulas.P_OPEN} AS p_open,
            {formulas.mean(formulas.kept_fraction('n_kept_gated'))} AS kept_kv
        FROM (
            SELECT model, context_length, evictor, task, budget{", " + draw if draw_columns else ""}{draw_col},
                score_full, score_plain, score_gated, n_kept_gated, n_tokens, gate_open
            FROM ({gated}) g{draw_join}{draw_where}
        )
        GROUP BY ALL"""


#: The columns of the per-draw query that are means over the cell's outcome rows.
_MEANS = tuple(c for c in WHATIF_COLUMNS[6:] if c not in ("delta", "degenerate"))


def _pooled(source: str, draw_columns: list[str], input_draws) -> str:
    """The per-draw rows of disjoint parts (runs) pooled: counts summed, means weighted by
    ``n_inputs`` (every mean of :func:`_per_draw` is over the cell's rows)."""
    keys = ", ".join([*_cell(input_draws).split(", "), *draw_columns])
    means = ", ".join(f"CASE WHEN count({c}) = count(*) THEN CAST(sum(CAST({c} * n_inputs AS DECIMAL(38, 18))) "
                      f"AS DOUBLE) / sum(n_inputs) END AS {c}" for c in _MEANS)
    return f"SELECT {keys}, sum(n_inputs) AS n_inputs, {means} FROM {source} GROUP BY {keys}"


def _over_draws(per_draw: str, draw_columns: list[str], input_draws) -> str:
    cell = _cell(input_draws)
    if not draw_columns:
        return f"{per_draw} ORDER BY {cell}"
    varying = [c for c in WHATIF_COLUMNS[6:] if c not in (*GATE_FREE, "delta", "degenerate")]
    return f"""
        SELECT {cell}, {", ".join(f"arg_min({c}, pair_draw) AS {c}" for c in GATE_FREE)},
            {", ".join(f"{formulas.mean(c)} AS {c}" for c in varying)}
        FROM ({per_draw}) GROUP BY ALL ORDER BY {cell}"""


def _run_by_run(con, draw_columns: list[str], input_draws) -> pl.DataFrame:
    """:func:`whatif_query` evaluated one run at a time and pooled.

    The join key starts with ``run_id``, so the join of ``outcomes`` with ``decisions``
    falls apart into one join per run: each run's rows are joined and aggregated alone
    (DuckDB reads only that run's files, by the parquet statistics of ``run_id``), and the
    per-run cells are pooled by :func:`_pooled`. Memory and temporary disk then grow with
    the largest run, not with the release (one join over 100M inputs × 9 budgets exhausted
    a 2 GB memory limit and 40 GB of spill). In-memory logs are evaluated the same way,
    so that the table is one computation whichever container holds the logs.
    """
    runs = [r for (r,) in con.sql("SELECT DISTINCT run_id FROM inputs ORDER BY run_id").fetchall()]
    # the held-out pilot's keys once (a view over every input: each run's query would scan them all again)
    con.execute("CREATE OR REPLACE TEMP TABLE _run_held_out AS SELECT * FROM held_out")
    tables = {t: f"_run_{t}" for t in ("outcomes", "decisions", "inputs")} | {"held_out": "_run_held_out"}
    parts = []
    for run in runs:
        literal = "'" + str(run).replace("'", "''") + "'"
        for table in ("outcomes", "decisions", "inputs"):
            con.execute(f"CREATE OR REPLACE TEMP VIEW _run_{table} AS SELECT * FROM {table} WHERE run_id = {literal}")
        parts.append(con.sql(_per_draw(draw_columns, input_draws, tables)).pl())
    con.register("_per_run", pl.concat(parts, how="vertical_relaxed"))
    return con.sql(_over_draws(_pooled("_per_run", draw_columns, input_draws), draw_columns, input_draws)).pl()


#: Per (model, context_length): the gate-open fraction over the decisions (inputs × head-pair
#: draws) and whether it is 0 or 1 (App. A.3.1: "its gate-open fraction is 0.00. The gate has
#: silently become full-KV fallback").
DEGENERATE_QUERY = f"""
    SELECT model, context_length, p_open, {formulas.DEGENERATE} AS degenerate
    FROM (SELECT model, context_length, {formulas.P_OPEN} AS p_open FROM decisions GROUP BY ALL)"""


def logged_input_draws(con) -> list[int]:
    """The input draws (``inputs.draw``, the seed of the input draw) of the logs on ``con``."""
    if "draw" not in [row[0] for row in con.sql("DESCRIBE inputs").fetchall()]:
        return []
    return [row[0] for row in con.sql("SELECT DISTINCT draw FROM inputs ORDER BY draw").fetchall()]


def whatif_table(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec(), *,
                 input_draws: str | int | None = None) -> pl.DataFrame:
    """Per (model, context_length, evictor, task, budget): accuracy, Δ, harm, p_open, kept-KV
    (:data:`WHATIF_COLUMNS`, sorted by the five cell keys) under ``policy`` (default fixed τ = 0.07)
    and ``profile`` (default: the logged D).

    Notes
    -----
    Over the inputs x of the row's (model, context_length, task), at the row's evictor and budget b:
    ``acc_*`` (the gated arm per Eq. 2), ``delta`` = acc_gated − acc_plain, ``harm_*`` =
    Pr[A(b, x) < full_score(x)] (Table 27), ``p_open``, and ``kept_kv`` = mean n_kept/n_tokens of the
    gated arm. With head-pair draws each column is the mean over the draws (equal weight).

    ``input_draws``: by default, when several input draws are logged, each row is one draw's (a last
    ``draw`` column); ``"pooled"`` pools them (``draw`` null); an integer keeps that draw's inputs (the
    gate is still calibrated on every input).

    ``degenerate``: the gate of the row's (model, context_length) opens on none or on all of its inputs,
    so the gated arm is a fallback and Δ measures the threshold, not the profile (App. A.3.1).
    """
    with Replay(logs, policy, profile) as session:
        return replay_whatif(session, input_draws=input_draws)


def whatif_with_pilot(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec(), *,
                      input_draws: str | int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What ``pagestats whatif`` prints: the :func:`whatif_table` and the calibration pilot of one replay."""
    with Replay(logs, policy, profile) as session:
        return replay_whatif(session, input_draws=input_draws), session.pilot_composition()


def replay_whatif(session: Replay, *, input_draws: str | int | None = None) -> pl.DataFrame:
    """:func:`whatif_table` of the replay ``session`` (its decisions, made once)."""
    con = session.con
    present = logged_input_draws(con)
    if input_draws not in (None, "pooled") and (isinstance(input_draws, bool) or input_draws not in present):
        raise ValueError(f"input_draws takes pooled or one of the logged input draws {present}, got {input_draws!r}")
    mode = (input_draws if input_draws not in (None, "pooled")
            else ("split" if input_draws is None and len(present) > 1 else None))
    draw_columns = session.decisions_relation()
    if con.sql("SELECT count(DISTINCT run_id) FROM inputs").fetchall()[0][0] > 1:
        table = _run_by_run(con, draw_columns, mode)  # one join per run
    else:
        table = con.sql(whatif_query(draw_columns, mode)).pl()
    cells = con.sql(DEGENERATE_QUERY).pl()
    if input_draws == "pooled" and len(present) > 1:
        table = table.with_columns(pl.lit(None, pl.Int64).alias("draw"))  # null: the draws are pooled
    orphans = table.filter(pl.col("model").is_null())
    if orphans.height:
        raise ValueError(f"{int(orphans['n_inputs'].sum())} outcome row(s) have no input row")
    return table.select(
        *WHATIF_CELL,
        pl.col("n_inputs").cast(pl.Int64),
        *(
            formulas.expr(formulas.DELTA).alias(c) if c == "delta" else pl.col(c).cast(pl.Float64)
            for c in WHATIF_COLUMNS[6:-1]
        ),
        pl.struct(MODEL_CELL).is_in(cells.filter("degenerate").select(pl.struct(MODEL_CELL)).to_series().implode())
        .alias("degenerate"),
        *([pl.col("draw").cast(pl.Int64)] if "draw" in table.columns else []),
    )


#: The columns of :func:`whatif_summary` after its group keys.
SUMMARY_COLUMNS = ("n_inputs", "acc_plain", "acc_gated", "delta", "harm_plain", "harm_gated", "p_open", "kept_kv")
#: File formats of :func:`write_whatif`, by extension.
WHATIF_FORMATS = (".csv", ".parquet", ".json")


def whatif_summary(table: pl.DataFrame, by=MATRIX_CELL) -> pl.DataFrame:
    """The what-if table pooled into groups: one row per value of ``by``.

    Parameters
    ----------
    table : polars.DataFrame
        :func:`whatif_table` output (possibly filtered to some rows).
    by : sequence of str
        Group keys, any of the five cell keys (default the matrix cell, model × context ×
        evictor).

    Returns
    -------
    polars.DataFrame
        ``by`` then :data:`SUMMARY_COLUMNS`, sorted by ``by``.

    Notes
    -----
    Each value column is the mean over the group's inputs and budgets b < 1 (every budget
    when ``budget`` is a key) of the per-input quantity: the per-cell values are averaged with
    their ``n_inputs`` as weights. Every (evictor, budget) arm of a run holds the same inputs,
    so ``delta`` is the paper's Δ of a cell (§4, Table 2: the mean over inputs and budgets
    b < 1 of gated − plain). ``n_inputs`` counts each input of the group once: the inputs of
    each (model, context_length, task) are counted at one budget and one evictor.
    """
    by = [by] if isinstance(by, str) else list(by)
    unknown = [k for k in by if k not in WHATIF_CELL]
    if not by or unknown or len(set(by)) != len(by):
        raise ValueError(f"by takes distinct keys among {', '.join(WHATIF_CELL)}; got {','.join(by) or 'nothing'}")
    if "draw" in table.columns and table["draw"].null_count() < table.height and "draw" not in by:
        by = [*by, "draw"]  # input draws are summarised apart unless pooled on purpose (--input-draws pooled)
    rows = table if "budget" in by else table.filter(formulas.EVICTED)
    if rows.height == 0:
        raise ValueError("no rows with an eviction budget b < 1 to summarise")
    weight = pl.col("n_inputs").cast(pl.Float64)
    values = [c for c in SUMMARY_COLUMNS if c != "n_inputs"]
    # a cell with an unknown value (formulas.with_full) leaves its group's pooled value unknown
    pooled = rows.group_by(by).agg(*(pl.when(pl.col(c).null_count() == 0)
                                     .then((pl.col(c) * weight).sum() / weight.sum()).alias(c) for c in values))
    input_keys = list(dict.fromkeys([*by, "model", "context_length", "task"]))
    counts = (rows.group_by(input_keys).agg(pl.col("n_inputs").max())
              .group_by(by).agg(pl.col("n_inputs").sum().cast(pl.Int64)))
    return pooled.join(counts, on=by).select(*by, *SUMMARY_COLUMNS).sort(by)


def filter_whatif(table: pl.DataFrame, *, evictor=None, task=None, context_length=None) -> pl.DataFrame:
    """The rows of a what-if table whose evictor, task and context length are among the given
    values (``None`` keeps all). A value the table does not hold is a ``ValueError`` that
    lists the values it does hold."""
    for column, wanted in (("evictor", evictor), ("task", task), ("context_length", context_length)):
        if wanted is None:
            continue
        wanted = list(wanted)
        have = table[column].unique().sort().to_list()
        missing = [w for w in wanted if w not in have]
        if missing:
            raise ValueError(f"no {column} {', '.join(map(str, missing))} in the logs; "
                             f"they hold {', '.join(map(str, have))}")
        table = table.filter(pl.col(column).is_in(wanted))
    return table


def write_whatif(table: pl.DataFrame, path) -> str:
    """Write a what-if table to ``path`` in the format its extension names: ``.csv`` (floats at
    full precision), ``.parquet`` or ``.json`` (a list of records). Returns the path."""

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WHATIF_FORMATS:
        raise ValueError(f"-o {path}: the extension must be one of {', '.join(WHATIF_FORMATS)}")
    if suffix == ".csv":
        csv_frame(table).write_csv(path, float_precision=None)  # names escaped (pagestats.core.escape)
    elif suffix == ".parquet":
        table.write_parquet(path)
    else:
        table.write_json(path)
    return str(path)


def describe_profile(profile: ProfileSpec) -> str:
    """The changes of ``profile`` from the default, in the CLI's words (e.g. ``"layers first-half"``)."""
    default = ProfileSpec()
    parts = []
    names = {"layers": "layers", "bin_fraction": "bins", "convention": "bins", "pairs_fraction": "pairs-fraction",
             "k": "k", "statistic": "statistic"}
    for field, label in names.items():
        value = getattr(profile, field)
        if value != getattr(default, field):
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            parts.append(f"{label} {shown}")
    return ", ".join(parts) or "the logged D"


def degenerate_messages(table: pl.DataFrame, profile: ProfileSpec = ProfileSpec(), recalibrate: str = "none") -> list[str]:
    """One warning line per degenerate (model, context_length) cell of a :func:`whatif_table`,
    naming the cause (the profile change and which side of τ every input fell on)."""
    cells = table.filter(pl.col("degenerate")).group_by(list(MODEL_CELL)).agg(pl.col("p_open").mean()).sort(
        list(MODEL_CELL))
    lines = []
    for model, ctx, p_open in cells.iter_rows():
        side = "D < τ on every input; the gate never opens" if p_open == 0 else \
            "D ≥ τ on every input; the gate always opens"
        hint = "; pass --recalibrate z" if recalibrate == "none" else ""
        lines.append(f"warning: {describe_profile(profile)}: {side} ({model}, {ctx} tokens){hint}")
    return lines
