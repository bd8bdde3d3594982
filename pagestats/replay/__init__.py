"""Offline replay of the PAGE gate from logs: recompute D under any profile spec, apply any
policy, and substitute the full-KV outcome where the gate closes (Eq. 2). :class:`Replay` is one
replay on one DuckDB connection; the other functions are one call of it each.

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D); App. F (deployed bins); Table 24 (strict thirds);
App. A.3.1 (k); A.3.3 (profile statistics); A.3.4 (calibration, threshold sensitivity,
Fig. 6); A.3.5 (head-pair subsampling, Table 9; layer subsampling, Table 10).
"""

from pagestats.replay.curve import TAU_CURVE_COLUMNS, paper_tau_curve, tau_curve
from pagestats.replay.frames import (
    DELTA_COLUMNS,
    GATE_COLUMNS,
    GATED_OUTCOME_COLUMNS,
    gated_from_decisions,
    plain_outcomes,
)
from pagestats.replay.pilot import PILOT_SPLITS, pilot_mask
from pagestats.replay.policies import (
    RECALIBRATE_MODES,
    CustomPolicy,
    FixedTau,
    Midpoint,
    Policy,
    RecalibratedTau,
    TaskOracle,
    ZScored,
    recalibrate,
)
from pagestats.replay.session import (
    PILOT_COLUMNS,
    Replay,
    decisions_by_draw,
    gate,
    gated_outcomes,
    pilot_composition,
)
from pagestats.replay.spec import (
    LAYER_SUBSETS,
    STATISTICS,
    ProfileSpec,
    pair_subsets,
    profile_drop,
    profile_drop_by_draw,
)

__all__ = [
    "DELTA_COLUMNS",
    "GATED_OUTCOME_COLUMNS",
    "GATE_COLUMNS",
    "LAYER_SUBSETS",
    "PILOT_COLUMNS",
    "PILOT_SPLITS",
    "RECALIBRATE_MODES",
    "STATISTICS",
    "TAU_CURVE_COLUMNS",
    "CustomPolicy",
    "FixedTau",
    "Midpoint",
    "Policy",
    "ProfileSpec",
    "RecalibratedTau",
    "Replay",
    "TaskOracle",
    "ZScored",
    "decisions_by_draw",
    "gate",
    "gated_from_decisions",
    "gated_outcomes",
    "pair_subsets",
    "pilot_composition",
    "plain_outcomes",
    "pilot_mask",
    "profile_drop",
    "profile_drop_by_draw",
    "recalibrate",
    "tau_curve",
    "paper_tau_curve",
]
