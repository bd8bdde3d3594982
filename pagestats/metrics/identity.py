"""Evictors whose outcomes are identical: cells of a matrix that are not independent.

Two evictors of a (model, context) can produce the same outcome on every evicting row: the
release's Qwen2.5-14B H2O equals its SnapKV on all 600 evicting rows (the authors' audit: a
two-pass prefill made H2O score like SnapKV; PAGE §4.1, Table 2's "†Qwen2.5-14B H2O is not an
independent cell"), and at a budget whose ⌊b·T⌋ is below the protected positions every evictor
keeps the same sinks and recent window (the budget rule, App. A.2.3; Table 26). Their cells then
agree by construction, not as a finding, and a table says so beside them.
"""

from __future__ import annotations

import polars as pl

from pagestats.core import formulas
from pagestats.core.columns import MODEL_CELL, input_key, require_columns

__all__ = ["identical_evictors"]

#: The outcome columns compared: the plain arm's score and kept tokens.
OUTCOME = ("score_plain", "n_kept_plain")
_SEED = 0x5EED


def identical_evictors(gated: pl.DataFrame, by=MODEL_CELL) -> pl.DataFrame:
    """Per (``by``, evictor): the other evictors of the group whose outcomes equal this one's on every
    evicting row.

    An evicting row is one at a budget b < 1 (:data:`pagestats.core.formulas.EVICTED`). Two evictors are
    identical in a group when they hold the same (input, budget) rows there and their plain outcomes,
    ``score_plain`` and ``n_kept_plain``, are equal on every one of them; their gated outcomes are then
    equal too (Eq. 2: where the gate opens the gated arm is the plain outcome, elsewhere the full cache,
    the same for both), so their rows of every table agree by construction.

    Parameters
    ----------
    gated : polars.DataFrame
        :func:`pagestats.replay.gated_outcomes` rows (or any frame with ``by``, ``evictor``, the input
        key, ``budget``, ``score_plain`` and ``n_kept_plain``).
    by : sequence of str
        The groups whose evictors are compared (default the (model, context) cell; add ``budget`` to
        compare at each budget).

    Returns
    -------
    polars.DataFrame
        ``by``, ``evictor``, ``n_rows`` (evicting rows of the evictor in the group) and ``same_as``
        (the other identical evictors of the group, sorted and joined by ", "; null when none).
        Groups without an evicting row are left out.

    Notes
    -----
    Each evictor's rows are summed as 64-bit hashes of (input, budget, outcome) per group: evictors
    whose row counts and sums differ are not identical. Those whose sums agree are compared row by row
    (sorted by input and budget), so a hash collision never makes two evictors identical.
    """
    by = [by] if isinstance(by, str) else list(by)
    key = [c for c in [*input_key(gated), "budget"] if c not in by]
    require_columns(gated, [*by, "evictor", *key, *OUTCOME], "identical_evictors")
    cols = list(dict.fromkeys([*by, "evictor", "budget"]))
    sig = (gated.select(*cols, pl.struct(*key, *OUTCOME).hash(_SEED).alias("_h"))
           .filter(formulas.EVICTED)
           .group_by([*by, "evictor"]).agg(pl.len().cast(pl.Int64).alias("n_rows"), pl.col("_h").sum().alias("_sig")))
    groups = (sig.group_by([*by, "n_rows", "_sig"]).agg(pl.col("evictor").sort())
              .filter(pl.col("evictor").list.len() > 1))
    same: list[dict] = []
    for row in groups.iter_rows(named=True):
        where = pl.all_horizontal(*(pl.col(c) == row[c] for c in by)) if by else pl.lit(True)
        classes: list[tuple[pl.DataFrame, list[str]]] = []
        for ev in row["evictor"]:
            rows = (gated.filter(where & (pl.col("evictor") == ev) & formulas.EVICTED)
                    .select(*key, *OUTCOME).sort(key))
            for ref, members in classes:
                if rows.equals(ref):
                    members.append(ev)
                    break
            else:
                classes.append((rows, [ev]))
        for _, members in classes:
            for ev in members if len(members) > 1 else ():
                same.append({**{c: row[c] for c in by}, "evictor": ev,
                             "same_as": ", ".join(str(m) for m in members if m != ev)})
    out = sig.drop("_sig")
    if same:
        found = pl.DataFrame(same, schema={**{c: out.schema[c] for c in by}, "evictor": out.schema["evictor"],
                                           "same_as": pl.String})
        out = out.join(found, on=[*by, "evictor"], how="left", nulls_equal=True)
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("same_as"))
    return out.select(*by, "evictor", "n_rows", "same_as").sort([*by, "evictor"])
