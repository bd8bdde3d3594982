"""The release's per-layer agreement profiles (``drops_*`` files): ``task``, ``T`` and
``head_agreement_per_layer`` (a_ℓ, one float per layer), with no input id.

A profile file belongs to the gated inputs of the same (model, context, draw): its records match
them by position within each task, in file order. :func:`match_profiles` accepts a file only when,
for every record, T equals the gated input's T and D recomputed from the profile with the paper's
bins (k = ⌊L/3⌋ early and late layers, App. F) equals the gated input's ``drop`` to
:data:`DROP_MATCH`; otherwise it says why in one line and the run gets no profile from it.

References
----------
PAGE paper, §3 (Eq. 3: D from a_ℓ), App. F (the deployed bins).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.core.profile import drop_from_agreement
from pagestats.io.imports.records import Records, missing_keys

#: The largest |D from the profile − logged drop| a matched profile may show (issue 40: 1e-9).
DROP_MATCH = 1e-9


def match_profiles(records: Records, inputs: pl.DataFrame, n_layers: int) -> tuple[pl.DataFrame | None, str]:
    """The profile of each gated input, or ``None`` and the one-line reason the file is refused.

    Parameters
    ----------
    records : Records
        A ``profile`` file's records.
    inputs : polars.DataFrame
        The run's inputs (``task, input_id, n_tokens, drop``), each task in the gated file's order.
    n_layers : int
        The model's layer count (the manifest's); every profile must have this many values.

    Returns
    -------
    (frame, reason)
        ``frame`` has ``task, input_id, agreement`` (list of float64) for every matched input.
    """
    problems = missing_keys(records)
    if problems:
        return None, problems[0]
    frame = records.frame.select(pl.col("task").cast(pl.String), pl.col("T").cast(pl.Int64, strict=False),
                                 "head_agreement_per_layer", "_line")
    lengths = frame["head_agreement_per_layer"].list.len()
    if (lengths != n_layers).any():
        line = frame.filter(lengths != n_layers)["_line"][0]
        return None, f"line {line}: a profile of {lengths.filter(lengths != n_layers)[0]} layers, not the model's {n_layers}"
    position = pl.int_range(pl.len()).over("task")
    frame = frame.with_columns(position.alias("_pos"))
    ordered = inputs.with_columns(pl.int_range(pl.len()).over("task").alias("_pos"))
    counts = frame.group_by("task").len().join(ordered.group_by("task").len(), on="task", how="full", coalesce=True,
                                                suffix="_gated").fill_null(0).filter(pl.col("len") != pl.col("len_gated"))
    if counts.height:
        row = counts.sort("task").row(0, named=True)
        return None, (f"task {row['task']} has {row['len']} profiles and {row['len_gated']} gated inputs, so they "
                      "cannot be matched by position")
    joined = frame.join(ordered, on=["task", "_pos"], how="inner")
    wrong_t = joined.filter(pl.col("T") != pl.col("n_tokens"))
    if wrong_t.height:
        r = wrong_t.row(0, named=True)
        return None, f"line {r['_line']}: T {r['T']} differs from gated input ({r['task']}, {r['input_id']}) T {r['n_tokens']}"
    agreement = joined["head_agreement_per_layer"].cast(pl.List(pl.Float64)).list.to_array(n_layers).to_numpy()
    recomputed = drop_from_agreement(agreement, defaults.BIN_FRACTION, defaults.BIN_CONVENTION)
    gap = np.abs(recomputed - joined["drop"].to_numpy())
    if not np.all(gap <= DROP_MATCH):
        i = int(np.argmax(gap))
        r = joined.row(i, named=True)
        return None, (f"line {r['_line']}: D from the profile {recomputed[i]!r} differs from gated input "
                      f"({r['task']}, {r['input_id']}) drop {r['drop']!r} by {gap[i]:.2e} (> {DROP_MATCH:g})")
    return joined.select("task", "input_id", pl.col("head_agreement_per_layer").alias("agreement")), ""
