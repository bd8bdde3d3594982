"""One function per paper figure, each with a pure ``*_data`` preparation function.

Every figure function takes the data first and everything else keyword-only, accepts
``ax=`` (one Axes, or a sequence of Axes for small multiples) and returns the ``Figure`` it
drew on, which a notebook displays inline; :func:`cell_label` is the one label of a
(model, context[, evictor]) cell. Figures are ``matplotlib.figure.Figure`` on the Agg canvas:
no ``pyplot``, nothing to close.

=========  =====================================  ===================================
Paper      figure function                        data function
=========  =====================================  ===================================
Fig. 2     :func:`drop_by_task`                   :func:`drop_by_task_data`
Fig. 3     :func:`accuracy_vs_budget`             :func:`accuracy_by_budget_data`
Fig. 4     :func:`accuracy_vs_kept_kv`            :func:`frontier_data`
Fig. 5     :func:`agreement_profile`              :func:`agreement_profile_data`
Fig. 6     :func:`tau_sensitivity`                :func:`tau_sensitivity_data`
Fig. 7     :func:`delta_of_f`                     :func:`delta_of_f_data`
Fig. 8     :func:`delta_matrix`                   :func:`delta_matrix_data`
Fig. 9     :func:`rho_vs_headroom`                :func:`scaling_data`
Fig. 10    :func:`recovery_distribution`          :func:`recovery_distribution_data`
Fig. 11    :func:`recovery_fraction`              :func:`recovery_fraction_data`
new        :func:`decision_frontier`              :func:`decision_frontier_data`
=========  =====================================  ===================================
"""

from pagestats.figures._style import COLUMN_WIDTH, cell_label, save_figure, style
from pagestats.figures.accuracy import (
    accuracy_by_budget_data,
    accuracy_vs_budget,
    accuracy_vs_kept_kv,
    frontier_data,
    pareto_mask,
)
from pagestats.figures.decision import decision_frontier, decision_frontier_data
from pagestats.figures.drop import (
    agreement_profile,
    agreement_profile_data,
    drop_by_task,
    drop_by_task_data,
    tau_sensitivity,
    tau_sensitivity_data,
)
from pagestats.figures.matrix import (
    delta_matrix,
    delta_matrix_data,
    delta_of_f,
    delta_of_f_data,
)
from pagestats.figures.recovery import (
    recovery_distribution,
    recovery_distribution_data,
    recovery_fraction,
    recovery_fraction_data,
)
from pagestats.figures.scaling import rho_vs_headroom, scaling_data

__all__ = [
    "COLUMN_WIDTH",
    "cell_label",
    "save_figure",
    "style",
    "accuracy_by_budget_data",
    "accuracy_vs_budget",
    "accuracy_vs_kept_kv",
    "frontier_data",
    "pareto_mask",
    "decision_frontier",
    "decision_frontier_data",
    "agreement_profile",
    "agreement_profile_data",
    "drop_by_task",
    "drop_by_task_data",
    "tau_sensitivity",
    "tau_sensitivity_data",
    "delta_matrix",
    "delta_matrix_data",
    "delta_of_f",
    "delta_of_f_data",
    "recovery_distribution",
    "recovery_distribution_data",
    "recovery_fraction",
    "recovery_fraction_data",
    "rho_vs_headroom",
    "scaling_data",
]
