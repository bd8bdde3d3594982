"""The what-if table of ``pagestats whatif``: the gate replayed under any policy and profile
spec, one row per (model, context_length, evictor, task, budget).

References
----------
PAGE paper, §3 (Eq. 2); §4 (Table 2 matrix cells); Table 27 (harm rate); App. A.3.4–A.3.5
(the what-ifs: τ, z-scored and midpoint thresholds, layer / head-pair / k subsampling).
"""

from __future__ import annotations

import polars as pl

from pagestats import metrics
from pagestats.columns import WHATIF_CELL
from pagestats.replay import FixedTau, Policy, ProfileSpec, gated_outcomes

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


def whatif_table(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Per (model, context_length, evictor, task, budget): accuracy, Δ, harm, p_open, kept-KV.

    Parameters
    ----------
    logs : pagestats.io.Logs
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
    budget b, each column is one metric of :mod:`pagestats.metrics`: ``acc_full``,
    ``acc_plain``, ``acc_gated`` and ``delta`` = acc_gated − acc_plain from
    :func:`~pagestats.metrics.accuracy` (gated per Eq. 2); ``harm_*`` = Pr[A(b, x) < full_score(x)]
    from :func:`~pagestats.metrics.harm_rate` (Table 27); ``p_open`` from
    :func:`~pagestats.metrics.p_open`; ``kept_kv`` = mean n_kept/n_tokens of the gated arm from
    :func:`~pagestats.metrics.kept_kv`. With head-pair draws (``profile.pairs_fraction``) each
    column is computed per draw and then averaged over the draws (equal weight);
    ``n_inputs``, ``acc_full``, ``acc_plain`` and ``harm_plain`` do not depend on the gate and
    are taken as they are, so they equal the draw-free values.
    """
    rows = gated_outcomes(logs, policy, profile)
    by = [*WHATIF_CELL, *(["pair_draw"] if "pair_draw" in rows.columns else [])]
    table = (
        metrics.accuracy(rows, by)
        .join(metrics.harm_rate(rows, by, "plain").select(*by, pl.col("harm").alias("harm_plain")), on=by)
        .join(metrics.harm_rate(rows, by, "gated").select(*by, pl.col("harm").alias("harm_gated")), on=by)
        .join(metrics.p_open(rows, by).select(*by, "p_open"), on=by)
        .join(metrics.kept_kv(rows, by, "gated", include_full=True).select(*by, "kept_kv"), on=by)
    )
    if "pair_draw" in by:
        same = ["n_inputs", "acc_full", "acc_plain", "harm_plain"]  # identical in every draw
        varying = [c for c in WHATIF_COLUMNS if c not in WHATIF_CELL and c not in same]
        table = table.group_by(WHATIF_CELL).agg(*(pl.col(c).first() for c in same), *(pl.col(c).mean() for c in varying))
    return table.select(
        *WHATIF_CELL,
        pl.col("n_inputs").cast(pl.Int64),
        *(pl.col(c).cast(pl.Float64) for c in WHATIF_COLUMNS[6:]),
    ).sort(WHATIF_CELL)
