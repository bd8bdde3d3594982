"""The what-if table of ``pagestats whatif`` (DESIGN §5): the gate replayed under any policy
and profile spec, one row per (model, context_length, evictor, task, budget).

References
----------
PAGE paper, §3 (Eq. 2); §4 (Table 2 matrix cells); Table 27 (harm rate); App. A.3.4–A.3.5
(the what-ifs: τ, z-scored and midpoint thresholds, layer / head-pair / k subsampling).
"""

from __future__ import annotations

import polars as pl

from pagestats import defaults
from pagestats.replay import LAYER_SUBSETS, FixedTau, Midpoint, Policy, ProfileSpec, TaskOracle, ZScored, gated_outcomes

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
CELL = ["model", "context_length", "evictor", "task", "budget"]


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
    budget b (DESIGN §5): ``acc_full`` = mean full_score; ``acc_plain`` / ``acc_gated`` = mean
    A(b, x) of the plain / gated arm (gated per Eq. 2); ``delta`` = acc_gated − acc_plain;
    ``harm_*`` = Pr[A(b, x) < full_score(x)] (Table 27); ``p_open`` = fraction of inputs whose
    gate opens; ``kept_kv`` = mean n_kept/n_tokens of the gated arm. With head-pair draws
    (``profile.pairs_fraction``) each column is computed per draw and then averaged over
    the draws (equal weight); ``n_inputs``, ``acc_full``, ``acc_plain`` and ``harm_plain`` do
    not depend on the gate and are taken as they are, so they equal the draw-free values.
    """
    rows = gated_outcomes(logs, policy, profile)
    draws = ["pair_draw"] if "pair_draw" in rows.columns else []
    table = rows.group_by([*CELL, *draws]).agg(
        pl.len().alias("n_inputs"),
        pl.col("score_full").mean().alias("acc_full"),
        pl.col("score_plain").mean().alias("acc_plain"),
        pl.col("score_gated").mean().alias("acc_gated"),
        (pl.col("score_plain") < pl.col("score_full")).mean().alias("harm_plain"),
        (pl.col("score_gated") < pl.col("score_full")).mean().alias("harm_gated"),
        pl.col("gate_open").mean().alias("p_open"),
        (pl.col("n_kept_gated") / pl.col("n_tokens")).mean().alias("kept_kv"),
    )
    table = table.with_columns((pl.col("acc_gated") - pl.col("acc_plain")).alias("delta"))
    if draws:
        same = ["n_inputs", "acc_full", "acc_plain", "harm_plain"]  # identical in every draw
        varying = [c for c in WHATIF_COLUMNS if c not in CELL and c not in same]
        table = table.group_by(CELL).agg(*(pl.col(c).first() for c in same), *(pl.col(c).mean() for c in varying))
    return table.select(
        *CELL,
        pl.col("n_inputs").cast(pl.Int64),
        *(pl.col(c).cast(pl.Float64) for c in WHATIF_COLUMNS[6:]),
    ).sort(CELL)


def policy_from_args(args) -> Policy:
    """The gate policy named by the ``pagestats whatif`` options (:mod:`pagestats.cli`).

    ``--tau X`` → :class:`FixedTau` (X); ``--policy fixed`` or no flag → fixed τ = 0.07;
    ``--policy z`` → :class:`ZScored` (``--theta``, ``--pilot``, ``--pilot-by``, ``--seed``);
    ``--policy midpoint`` → :class:`Midpoint` (samples by ``task_class``, as DESIGN §4 words
    Eq. 5; ``--midpoint-tasks niah_multikey_3,vt`` takes them from two named tasks, as the
    paper's Table 7 does); ``--policy oracle`` → :class:`TaskOracle`.
    """
    tau = getattr(args, "tau", None)
    name = getattr(args, "policy", None)
    if tau is not None:
        if name not in (None, "fixed"):
            raise ValueError(f"--tau applies to the fixed policy, not --policy {name}")
        return FixedTau(float(tau))
    if name in (None, "fixed"):
        return FixedTau(defaults.TAU)
    if name == "z":
        pilot_by = tuple(s.strip() for s in str(getattr(args, "pilot_by", "model")).split(",") if s.strip())
        return ZScored(
            theta_z=float(getattr(args, "theta", defaults.THETA_Z)),
            pilot_n=int(getattr(args, "pilot", defaults.PILOT_N)),
            pilot_by=pilot_by,
            seed=int(getattr(args, "seed", 0)),
        )
    if name == "midpoint":
        tasks = getattr(args, "midpoint_tasks", None)
        if tasks is None:
            return Midpoint()
        parts = [t.strip() for t in str(tasks).split(",")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"--midpoint-tasks takes CAPACITY_TASK,DILUTION_TASK (e.g. niah_multikey_3,vt), got {tasks!r}")
        return Midpoint(capacity_tasks=(parts[0],), dilution_tasks=(parts[1],))
    if name == "oracle":
        return TaskOracle()
    raise ValueError(f"unknown policy {name!r}; expected fixed, z, midpoint or oracle")


def parse_layers(text: str | None):
    """``--layers`` value → :attr:`ProfileSpec.layers`: a subset name, or indices from a comma
    list whose items are integers or half-open ranges ``a:b`` (e.g. ``"0:4,10,27"``)."""
    if text is None:
        return None
    text = text.strip()
    if text in LAYER_SUBSETS or not any(ch.isdigit() for ch in text):
        return text  # a named subset; ProfileSpec validates it
    idx: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            if ":" in item:
                lo, hi = item.split(":")
                idx.extend(range(int(lo), int(hi)))
            else:
                idx.append(int(item))
        except ValueError:
            raise ValueError(f"--layers: cannot read {item!r}; use a name, integers or a:b ranges") from None
    return tuple(idx)


def parse_fraction(text) -> float:
    """``--bins`` value → float: a decimal (``0.25``) or an exact fraction (``1/3``)."""
    from fractions import Fraction

    try:
        return float(Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--bins: cannot read {text!r}; use a decimal or a fraction such as 1/3") from None


def profile_from_args(args) -> ProfileSpec:
    """The :class:`ProfileSpec` named by ``--layers``, ``--pairs-fraction``, ``--draws``,
    ``--seed``, ``--k``, ``--bins`` and ``--strict-bins``."""
    bins = getattr(args, "bins", None)
    return ProfileSpec(
        layers=parse_layers(getattr(args, "layers", None)),
        bin_fraction=defaults.BIN_FRACTION if bins is None else parse_fraction(bins),
        convention="strict" if getattr(args, "strict_bins", False) else defaults.BIN_CONVENTION,
        pairs_fraction=getattr(args, "pairs_fraction", None),
        draws=int(getattr(args, "draws", 20)),
        seed=int(getattr(args, "seed", 0)),
        k=getattr(args, "k", None),
    )
