"""Offline replay of the PAGE gate from logs: recompute D under any profile spec, apply any
policy, and substitute the full-KV outcome where the gate closes (Eq. 2).

:mod:`~pagestats.replay.session` — :class:`Replay`, one replay (logs, policy, profile) on one DuckDB
connection: D and the decisions computed once, in SQL (:mod:`~pagestats.replay.relations`: the relations
``drops``, ``decisions``, ``held_out`` and ``gated``); :func:`gate`, :func:`gated_outcomes`,
:func:`decide_all` are one call of it, and :mod:`~pagestats.replay.frames` turns its decisions into the
per-row polars frames the tables read. :mod:`~pagestats.replay.spec` — :class:`ProfileSpec` and
:func:`profile_drop` (D recomputed from the stored profile with the collector's own definitions, so the
default spec reproduces the logged ``drop`` bit for bit). :mod:`~pagestats.replay.policies` — how τ is
chosen (every policy one ``calibrate(con, source)``, :mod:`~pagestats.replay.calibration`), with the
pilot (:mod:`~pagestats.replay.pilot`). :mod:`~pagestats.replay.curve` — :func:`tau_curve`, a whole
threshold sweep in one pass. :mod:`~pagestats.replay.whatif` — the what-if table of ``pagestats whatif``.

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
    decide_all,
    decide_each,
    gate,
    gate_by_draw,
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
    "decide_all",
    "decide_each",
    "gate",
    "gate_by_draw",
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
