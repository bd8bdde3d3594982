"""Offline replay of the PAGE gate from logs: recompute D under any profile spec, apply any
policy, and substitute the full-KV outcome where the gate closes (Eq. 2).

:mod:`~pagestats.replay.spec` — :class:`ProfileSpec` and :func:`profile_drop` (D recomputed
from the stored profile with the collector's own definitions, so the default spec reproduces
the logged ``drop`` bit for bit); :mod:`~pagestats.replay.policies` — how τ is chosen;
:mod:`~pagestats.replay.gate` — :func:`gate` and :func:`gated_outcomes`;
:mod:`~pagestats.replay.curve` — :func:`tau_curve`, a whole threshold sweep in one pass.

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D); App. F (deployed bins); Table 24 (strict thirds);
App. A.3.1 (k); A.3.3 (profile statistics); A.3.4 (calibration, threshold sensitivity,
Fig. 6); A.3.5 (head-pair subsampling, Table 9; layer subsampling, Table 10).
"""

from pagestats.replay.curve import TAU_CURVE_COLUMNS, tau_curve
from pagestats.replay.gate import (
    GATE_COLUMNS,
    GATED_OUTCOME_COLUMNS,
    gate,
    gated_outcomes,
)
from pagestats.replay.policies import (
    POLICY_TYPES,
    CustomPolicy,
    FixedTau,
    Midpoint,
    Policy,
    TaskOracle,
    ZScored,
    pilot_mask,
)
from pagestats.replay.spec import (
    LAYER_SUBSETS,
    STATISTICS,
    ProfileSpec,
    pair_subsets,
    profile_drop,
)

__all__ = [
    "GATED_OUTCOME_COLUMNS",
    "GATE_COLUMNS",
    "LAYER_SUBSETS",
    "POLICY_TYPES",
    "STATISTICS",
    "TAU_CURVE_COLUMNS",
    "CustomPolicy",
    "FixedTau",
    "Midpoint",
    "Policy",
    "ProfileSpec",
    "TaskOracle",
    "ZScored",
    "gate",
    "gated_outcomes",
    "pair_subsets",
    "pilot_mask",
    "profile_drop",
    "tau_curve",
]
