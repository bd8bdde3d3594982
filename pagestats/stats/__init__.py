"""Statistics of the PAGE paper at the NumPy level (NumPy, SciPy and statsmodels only; no polars).

Wilson intervals for rates (ρ, harm, p_open), Benjamini–Hochberg across cells, the cluster
bootstrap of the gating Δ (Table 28), the through-origin fit of the scaling relation
(Table 25) and the per-input AUC (Mann–Whitney, §3); and what no paper table has (issue 43,
docs/STATISTICS.md): sample sizes (:mod:`~pagestats.stats.power`), a τ certified by Learn then
Test (:mod:`~pagestats.stats.ltt`) and anytime-valid drift tests (:mod:`~pagestats.stats.sequential`). Results are small frozen dataclasses
with ``to_dict()``; their fields are scalars for scalar input and arrays for array input.
Frame-level wrappers live in :mod:`pagestats.metrics`.

References
----------
PAGE paper: §3 (Eq. 1, AUC), §4 "Uncertainty", §5 (Eq. 4), App. A.6.4 (Table 25),
App. A.7.2 (Tables 28–29).
"""

from pagestats.stats.auc import AUCResult, auc
from pagestats.stats.bootstrap import (
    BootstrapResult,
    bootstrap_pvalue,
    cluster_bootstrap,
    resample_counts,
    weighted_sums,
)
from pagestats.stats.fit import BinomialFitResult, FitResult, binomial_origin_fit, through_origin_fit
from pagestats.stats.ltt import Certificate, fixed_sequence_threshold
from pagestats.stats.multitest import BHResult, bh
from pagestats.stats.power import (
    DesignEffect,
    SampleSize,
    delta_sample_size,
    design_effect,
    harm_sample_size,
    rho_sample_size,
)
from pagestats.stats.sequential import SequentialResult, sequential_drift
from pagestats.stats.wilson import Interval, wilson

__all__ = [
    "AUCResult",
    "BHResult",
    "BootstrapResult",
    "FitResult",
    "Interval",
    "auc",
    "bh",
    "bootstrap_pvalue",
    "cluster_bootstrap",
    "resample_counts",
    "through_origin_fit",
    "weighted_sums",
    "binomial_origin_fit",
    "BinomialFitResult",
    "wilson",
    "Certificate",
    "fixed_sequence_threshold",
    "DesignEffect",
    "SampleSize",
    "delta_sample_size",
    "design_effect",
    "harm_sample_size",
    "rho_sample_size",
    "SequentialResult",
    "sequential_drift",
]
