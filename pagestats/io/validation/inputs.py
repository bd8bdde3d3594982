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

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), App. F (deployed bins). docs/SCHEMA.md (schema, reader rules).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from pagestats import defaults, profile
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import Problem, _mode_per_run, _out_of_range, emit

#: Tolerance of the logged-vs-recomputed drop check (float32 agreement → float64 D).
DROP_TOLERANCE = 1e-6


def _check_inputs(inp: pl.DataFrame, files, runs) -> list[Problem]:
    problems: list[Problem] = []
    problems += _out_of_range(inp, "full_score", 0.0, 1.0, files, "full_score outside [0, 1] or NaN")
    bad = inp.filter(pl.col("drop").is_not_null() & ~pl.col("drop").is_finite())
    problems += emit(bad.with_columns(pl.format("drop = {}", "drop").alias("_d")), files, "drop is NaN or infinite", "_d")
    for name in ("run_id", "task"):  # an exclusion RUN_ID/TASK/INPUT_ID could not name them
        bad = inp.filter(pl.col(name).str.contains("/", literal=True) | (pl.col(name) == ""))
        bad = bad.group_by(name).agg(pl.col("_file").first(), pl.col("_row").first(), pl.len())
        problems += emit(bad.with_columns(pl.format("{} = '{}' ({} inputs)", pl.lit(name), name,
                                                    "len").alias("_d")),
                         files, f"{name} is empty or contains '/' (it could not be named in --exclude)", "_d")
    bad = inp.filter(pl.col("n_tokens") < 1)
    problems += emit(bad.with_columns(pl.format("n_tokens = {}", "n_tokens").alias("_d")), files, "n_tokens < 1", "_d")

    frame = inp.select(
        "_file", "_row", "run_id", "task", "model", "context_length", "draw", "drop",
        pl.col("agreement").list.len().alias("_L"),
        pl.col("pair_jaccard").list.len().alias("_P"),
    ).join(_run_frame(runs), on="run_id", how="left")

    # model / context length / task against the manifest
    bad = frame.filter(pl.col("_model").is_not_null() & (pl.col("model") != pl.col("_model")))
    problems += emit(bad.with_columns(pl.format("model {} but the manifest says {}", "model", "_model").alias("_d")),
                     files, "model differs from the manifest", "_d")
    bad = frame.filter(pl.col("_context_length").is_not_null() & (pl.col("context_length") != pl.col("_context_length")))
    problems += emit(bad.with_columns(pl.format("context_length {} but the manifest says {}", "context_length",
                                                "_context_length").alias("_d")),
                     files, "context_length differs from the manifest", "_d")
    # one input draw per run (a replicate is a run, App. A.7.3): the manifest's draw, else the run's most common
    usual = _mode_per_run(frame.filter(pl.col("draw").is_not_null()), "draw").rename({"draw": "_usual_draw"})
    drawn = frame.join(usual, on="run_id", how="left").with_columns(
        pl.coalesce("_draw", "_usual_draw").alias("_ref_draw"),
        pl.when(pl.col("_draw").is_not_null()).then(pl.lit("the manifest's")).otherwise(pl.lit("the run's usual"))
        .alias("_ref_src"))
    bad = drawn.filter(pl.col("draw") != pl.col("_ref_draw"))
    problems += emit(bad.with_columns(pl.format("draw {} but {} draw is {}", "draw", "_ref_src", "_ref_draw").alias("_d")),
                     files, "draw differs within the run", "_d")
    for run_id, info in runs.items():
        if info.tasks is None:
            continue
        unknown = (
            frame.filter((pl.col("run_id") == run_id) & ~pl.col("task").is_in(list(info.tasks)))
            .group_by("task").agg(pl.col("_file").first(), pl.col("_row").first(), pl.len())
        )
        unknown = unknown.with_columns(pl.format("task {} ({} inputs)", "task", "len").alias("_d"))
        problems += emit(unknown, files, f"task not in the manifest tasks of run {run_id!r}", "_d")

    # agreement length: manifest n_layers, else the run's most common length
    ref = _mode_per_run(frame, "_L").rename({"_L": "_L_ref"})
    frame = frame.join(ref, on="run_id", how="left").with_columns(
        pl.coalesce("_n_layers", "_L_ref").alias("_L_exp"),
        pl.when(pl.col("_n_layers").is_not_null()).then(pl.lit("manifest model.n_layers"))
        .otherwise(pl.lit("the run's other inputs have")).alias("_L_src"),
    )
    bad = frame.filter(pl.col("_L") != pl.col("_L_exp"))
    problems += emit(bad.with_columns(pl.format("{} layers; {} {}", "_L", "_L_src", "_L_exp").alias("_d")),
                     files, "agreement length differs from the number of layers", "_d")
    bad = frame.filter(pl.col("_L") < 2)
    problems += emit(bad, files, "agreement has fewer than 2 layers")

    # pair_jaccard length: L·H(H−1)/2 (H from the manifest, else consistent and triangular)
    with_h = frame.filter(pl.col("_n_heads").is_not_null())
    expected = pl.col("_L_exp") * pl.col("_n_heads") * (pl.col("_n_heads") - 1) // 2
    bad = with_h.filter(pl.col("_P") != expected).with_columns(expected.alias("_P_exp"))
    problems += emit(bad.with_columns(pl.format("length {}; expected L·H(H−1)/2 = {} (L = {}, H = {})", "_P", "_P_exp",
                                                "_L_exp", "_n_heads").alias("_d")),
                     files, "pair_jaccard length differs from L·H(H−1)/2", "_d")
    without_h = frame.filter(pl.col("_n_heads").is_null())
    if without_h.height:
        pref = _mode_per_run(without_h, "_P").rename({"_P": "_P_ref"})
        w = without_h.join(pref, on="run_id", how="left")
        bad = w.filter(pl.col("_P") != pl.col("_P_ref"))
        problems += emit(bad.with_columns(pl.format("length {}; the run's other inputs have {}", "_P", "_P_ref").alias("_d")),
                         files, "pair_jaccard length inconsistent within the run", "_d")
        for rec in pref.join(ref, on="run_id").iter_rows(named=True):
            L, P = rec["_L_ref"], rec["_P_ref"]
            if L and (P % L or not _triangular(P // L)):
                first = w.filter((pl.col("run_id") == rec["run_id"]) & (pl.col("_P") == P)).head(1)
                problems += emit(first, files, f"pair_jaccard length {P} is not L·H(H−1)/2 for L = {L} and any H")

    # profile values are Jaccards: finite and in [0, 1]
    for col in ("agreement", "pair_jaccard"):
        x = pl.col(col)
        bad = inp.filter(x.list.len() > 0).filter(~x.list.sum().is_finite() | (x.list.min() < 0) | (x.list.max() > 1))
        problems += emit(bad, files, f"{col} has values outside [0, 1] or NaN")

    problems += _check_agreement_pairs(inp, files)
    problems += _check_drop(inp, frame, files, runs)
    return problems


#: Largest |a_ℓ − mean of layer ℓ's pair Jaccards| accepted. The collector logs both as float32 roundings
#: of one float64 computation (§3: a_ℓ is the mean pairwise Jaccard of the layer's heads), so they agree
#: to float32 precision (≤ 6e-8 on the shipped logs).
AGREEMENT_TOLERANCE = 1e-6
_PAIR_CHUNK = 16_384  # inputs per block of the agreement check (bounds memory at ~1K pairs per input)


def _check_agreement_pairs(inp: pl.DataFrame, files) -> list[Problem]:
    """``agreement`` equals the per-layer mean of ``pair_jaccard`` (§3, Eq. 3), where both are logged.

    Rows whose lists have lengths that do not split into L layers are reported by the length rules;
    NaN or out-of-range values by the range rule (a NaN difference is not reported twice here).
    """
    frame = inp.select(
        "_file", "_row", "agreement", "pair_jaccard",
        pl.col("agreement").list.len().alias("_L"), pl.col("pair_jaccard").list.len().alias("_P"),
    ).filter((pl.col("_L") >= 1) & (pl.col("_P") > 0) & (pl.col("_P") % pl.col("_L") == 0))
    bad_parts = []
    for (n_layers, n_pairs), group in frame.group_by("_L", "_P"):
        per_layer = n_pairs // n_layers
        for start in range(0, group.height, _PAIR_CHUNK):
            block = group.slice(start, _PAIR_CHUNK)
            a = block["agreement"].list.to_array(n_layers).to_numpy().astype(np.float64)
            j = block["pair_jaccard"].list.to_array(n_pairs).to_numpy().astype(np.float64)
            err = np.abs(j.reshape(len(block), n_layers, per_layer).mean(axis=-1) - a).max(axis=-1)
            hit = err > AGREEMENT_TOLERANCE
            if hit.any():
                bad_parts.append(block.filter(pl.Series(hit)).select("_file", "_row").with_columns(
                    pl.Series("_d", [f"max |a_ℓ − mean pair Jaccard| = {e:.3g}" for e in err[hit]])))
    if not bad_parts:
        return []
    return emit(pl.concat(bad_parts), files, "agreement differs from the layer means of pair_jaccard", "_d")


def _triangular(p: int) -> bool:
    h = int(round((1 + math.sqrt(1 + 8 * p)) / 2))
    return h >= 2 and h * (h - 1) // 2 == p


def _check_drop(inp: pl.DataFrame, frame: pl.DataFrame, files, runs) -> list[Problem]:
    """Logged ``drop`` against :func:`pagestats.profile.drop_from_agreement` (Eq. 3), per bins setting."""
    problems: list[Problem] = []
    base = inp.select("_file", "_row", "run_id", "drop", "agreement").with_columns(
        pl.col("agreement").list.len().alias("_L")
    ).filter(pl.col("drop").is_finite() & (pl.col("_L") >= 2))
    settings: dict[tuple[float, str], list[str]] = {}
    for run_id in base["run_id"].unique().to_list():
        info = runs.get(run_id)
        key = (info.bin_fraction, info.convention) if info else (defaults.BIN_FRACTION, defaults.BIN_CONVENTION)
        settings.setdefault(key, []).append(run_id)
    for (fraction, convention), run_ids in settings.items():
        sub = base.filter(pl.col("run_id").is_in(run_ids))
        for (n_layers,), group in sub.group_by("_L"):
            arr = group["agreement"].list.to_array(int(n_layers)).to_numpy()
            try:
                recomputed = profile.drop_from_agreement(arr, fraction, convention)
            except ValueError as err:
                problems += emit(group.head(1), files, f"cannot compute drop: {err}")
                continue
            diff = np.abs(recomputed - group["drop"].to_numpy())
            mask = diff > DROP_TOLERANCE  # NaN agreement is reported by the range check
            if mask.any():
                bad = group.filter(pl.Series(mask)).with_columns(pl.Series("_re", recomputed[mask]))
                bad = bad.with_columns(pl.format("logged {} but agreement gives {}", "drop", "_re").alias("_d"))
                problems += emit(bad, files, f"drop disagrees with drop_from_agreement(agreement, bins={fraction:.6g}, "
                                             f"{convention}) by more than {DROP_TOLERANCE:g}", "_d")
    return problems
