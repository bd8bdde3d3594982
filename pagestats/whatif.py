"""The what-if table of ``pagestats whatif``: the gate replayed under any policy and profile
spec, one row per (model, context_length, evictor, task, budget).

References
----------
PAGE paper, §3 (Eq. 2); §4 (Table 2 matrix cells); Table 27 (harm rate); App. A.3.4–A.3.5
(the what-ifs: τ, z-scored and midpoint thresholds, layer / head-pair / k subsampling).
"""

from __future__ import annotations

import polars as pl

from pagestats.columns import WHATIF_CELL
from pagestats import formulas
from pagestats.replay import FixedTau, Policy, ProfileSpec
from pagestats.replay import sql as replay_sql
from pagestats.formulas import N_KEPT_GATED, SCORE_GATED
from pagestats.schema import INPUT_KEY

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
)
#: Columns that do not depend on the gate: with head-pair draws they are taken from draw 0
#: (every draw holds the same rows), so they equal the draw-free values.
GATE_FREE = ("n_inputs", "acc_full", "acc_plain", "harm_plain")


def whatif_query(draws: list[str]) -> str:
    """The what-if as one DuckDB query over ``outcomes`` and ``decisions`` (one join).

    Every aggregate is a formula of :mod:`pagestats.formulas` and the gated arm is
    :data:`~pagestats.formulas.SCORE_GATED` / :data:`~pagestats.formulas.N_KEPT_GATED`,
    the same SQL text that polars evaluates in :mod:`pagestats.metrics` and
    :func:`pagestats.replay.gated_outcomes`.
    """
    cell = ", ".join(WHATIF_CELL)
    key = ", ".join(INPUT_KEY)
    draw = ", ".join(f"d.{c}" for c in draws)
    acc = ", ".join(f"{sql} AS {name}" for name, sql in formulas.ACCURACY.items())
    per_draw = f"""
        SELECT {cell}{", " + ", ".join(draws) if draws else ""}, count(*) AS n_inputs, {acc},
            {formulas.harm_count("score_plain")} / count(*) AS harm_plain,
            {formulas.harm_count("score_gated")} / count(*) AS harm_gated,
            {formulas.OPEN_COUNT} / count(*) AS p_open,
            avg({formulas.kept_fraction("n_kept_gated")}) AS kept_kv
        FROM (
            SELECT d.model, d.context_length, o.evictor, o.task, o.budget{", " + draw if draws else ""},
                d.full_score AS score_full, o.score AS score_plain, {SCORE_GATED} AS score_gated,
                {N_KEPT_GATED} AS n_kept_gated, n_tokens, gate_open
            FROM outcomes o LEFT JOIN decisions d USING ({key})
        )
        GROUP BY ALL"""
    if not draws:
        return f"{per_draw} ORDER BY {cell}"
    varying = [c for c in WHATIF_COLUMNS[6:] if c not in GATE_FREE and c != "delta"]
    return f"""
        SELECT {cell}, {", ".join(f"arg_min({c}, pair_draw) AS {c}" for c in GATE_FREE)},
            {", ".join(f"avg({c}) AS {c}" for c in varying)}
        FROM ({per_draw}) GROUP BY ALL ORDER BY {cell}"""


def whatif_table(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Per (model, context_length, evictor, task, budget): accuracy, Δ, harm, p_open, kept-KV.

    Parameters
    ----------
    logs : pagestats.io.Logs or pagestats.io.LogDB
        In-memory logs, or a database of views over the parquet files (out of core).
    policy : Policy
        Gate policy (default fixed τ = 0.07).
    profile : ProfileSpec
        How D is recomputed (default: the logged D).

    Returns
    -------
    polars.DataFrame
        Exactly :data:`WHATIF_COLUMNS`, sorted by the five cell keys.

    Notes
    -----
    Over the inputs x of the row's (model, context_length, task), at the row's evictor and
    budget b: ``acc_full``, ``acc_plain``, ``acc_gated`` (gated per Eq. 2) and ``delta`` =
    acc_gated − acc_plain (the formulas of :func:`~pagestats.metrics.accuracy`); ``harm_*`` =
    Pr[A(b, x) < full_score(x)] (:func:`~pagestats.metrics.harm_rate`, Table 27); ``p_open``
    (:func:`~pagestats.metrics.p_open`); ``kept_kv`` = mean n_kept/n_tokens of the gated arm
    (:func:`~pagestats.metrics.kept_kv`). One DuckDB query computes them all
    (:func:`whatif_query`, over the decisions of :func:`pagestats.replay.sql.decide`), so only
    the result rows reach Python. With head-pair draws (``profile.pairs_fraction``) each
    column is computed per draw and then averaged over the draws (equal weight);
    :data:`GATE_FREE` columns do not depend on the gate and equal the draw-free values.
    """
    con = replay_sql.connect(logs)
    try:
        draws = replay_sql.decide(con, logs, policy, profile)
        table = con.sql(whatif_query(draws)).pl()
    finally:
        con.close()
    orphans = table.filter(pl.col("model").is_null())
    if orphans.height:
        raise ValueError(f"{int(orphans['n_inputs'].sum())} outcome row(s) have no input row")
    return table.select(
        *WHATIF_CELL,
        pl.col("n_inputs").cast(pl.Int64),
        *(
            (pl.col("acc_gated") - pl.col("acc_plain")).alias(c) if c == "delta" else pl.col(c).cast(pl.Float64)
            for c in WHATIF_COLUMNS[6:]
        ),
    )
