"""Parameters of the synthetic-log generator: defaults, model shapes and the planted effect (the
generative rule is in :mod:`pagestats.testing.synthetic`).

References
----------
PAGE paper: §4 "Setup" (models, tasks), Table 27 (harm rate), Eq. 1 (ρ); docs/PERFORMANCE.md
(paper-scale log set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from pagestats.core import defaults

#: The eight RULER tasks drawn by default (a subset of ``defaults.RULER_TASKS``).
SYNTHETIC_TASKS = tuple(t for t in defaults.RULER_TASKS if t not in ("cwe", "qa_1", "qa_2"))
#: References per input (RULER ``string_match_all`` scores are multiples of 1/m); tasks
#: not listed have one reference.
DEFAULT_N_REFERENCES = {"niah_multivalue": 4, "niah_multiquery": 4, "vt": 5, "fwe": 3, "cwe": 10}
#: Fixed ``created_at`` so that a seed gives byte-identical manifests.
DEFAULT_CREATED_AT = "2000-01-01T00:00:00+00:00"
SIGNAL_NAMES = ("attention_entropy", "top1_mass", "sink_mass", "key_norm_cv", "mean_agreement")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a synthetic model; only ``n_layers`` (L) and ``n_heads`` (H) matter to D."""

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int = 64
    dtype: str = "bfloat16"
    attn_impl: str = "sdpa"

    def manifest(self) -> dict:
        """The manifest's ``model`` block (schema.MANIFEST_MODEL_KEYS, plus ``revision``)."""
        return {
            "name": self.name,
            "revision": "synthetic",
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads if self.n_kv_heads is not None else self.n_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "attn_impl": self.attn_impl,
        }


#: Small default models (fast tests).
DEFAULT_MODELS = (ModelSpec("synthetic-12L4H", 12, 4, 2), ModelSpec("synthetic-16L6H", 16, 6, 2))
#: Shapes of the paper's four matrix models (§4 "Setup"; public configs).
PAPER_MODELS = (
    ModelSpec("Qwen2.5-1.5B-Instruct", 28, 12, 2, 128),
    ModelSpec("Qwen2.5-3B-Instruct", 36, 16, 2, 128),
    ModelSpec("Qwen2.5-14B-Instruct", 48, 40, 8, 128),
    ModelSpec("Mistral-7B-Instruct-v0.3", 32, 32, 8, 128),
)


#: The paper-scale log set of docs/PERFORMANCE.md used by the benchmarks: 4 models × 4 evictors = 16 cells,
#: 4 tasks × 100 inputs = 400 inputs per cell, 9 budgets. Pass as ``synthetic_logs(**PAPER_SCALE, ...)``.
PAPER_SCALE = dict(
    models=tuple(ModelSpec(f"synthetic-{L}L{H}H", L, H) for L, H in ((28, 12), (36, 16), (32, 32), (24, 14))),
    context_lengths=(4096,),
    tasks=("niah_multikey_3", "vt", "fwe", "niah_single_1"),
    n_inputs=100,
    seed=0,
)

@dataclass(frozen=True)
class ClassEffect:
    """Planted parameters of one task class (see :mod:`pagestats.testing` for the rule).

    Attributes
    ----------
    drop_mean, drop_sd : float
        Mean and sd of the target drop d.
    level_low, level_high : float
        Range of the late-layer target agreement (Jaccard).
    p_full : float
        Probability that the full-KV answer is correct.
    harm_scale, harm_power : float
        Harm probability of a full-correct input at budget b: harm_scale·(1−b)^harm_power.
    recovery_scale : float
        Recovery probability of a full-wrong input at budget b: recovery_scale·4b(1−b).
    """

    drop_mean: float
    drop_sd: float
    p_full: float
    harm_scale: float
    harm_power: float
    recovery_scale: float
    level_low: float = 0.15
    level_high: float = 0.30

    def __post_init__(self):
        for name in ("p_full", "recovery_scale"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.harm_scale < 0 or self.harm_power <= 0 or self.drop_sd < 0:
            raise ValueError("harm_scale and drop_sd must be ≥ 0 and harm_power > 0")
        if not 0.0 <= self.level_low <= self.level_high < 1.0:
            raise ValueError("need 0 ≤ level_low ≤ level_high < 1")


@dataclass(frozen=True)
class PlantedEffect:
    """The planted partition: one :class:`ClassEffect` per class, and per-evictor harm multipliers.

    Defaults: capacity-bound D ≈ 0.02 (below τ = 0.07), full KV correct 90%, harm
    (1−b)^1.5 (≈ 0.91 at b = 1/16), never recovered (ρ = 0); dilution-prone D ≈ 0.12, full
    KV correct 70%, mild harm 0.1·(1−b)², recovery 0.4·4b(1−b) (ρ = 0.12 ≥ 0.05).
    ``evictor_harm`` maps an evictor name to a multiplier of its harm probability (1 if
    absent).
    """

    capacity_bound: ClassEffect = ClassEffect(
        drop_mean=0.02, drop_sd=0.015, p_full=0.9, harm_scale=1.0, harm_power=1.5, recovery_scale=0.0
    )
    dilution_prone: ClassEffect = ClassEffect(
        drop_mean=0.12, drop_sd=0.03, p_full=0.7, harm_scale=0.1, harm_power=2.0, recovery_scale=0.4
    )
    evictor_harm: Mapping[str, float] = field(default_factory=dict)

    def for_class(self, task_class: str) -> ClassEffect:
        if task_class == defaults.CAPACITY_BOUND:
            return self.capacity_bound
        if task_class == defaults.DILUTION_PRONE:
            return self.dilution_prone
        raise ValueError(
            f"unknown task class {task_class!r}; expected {defaults.CAPACITY_BOUND!r} or {defaults.DILUTION_PRONE!r}"
        )

    def harm_probability(self, task_class: str, budget, evictor: str) -> np.ndarray:
        """h_{c,e}(b) = min(1, harm_scale·evictor_harm[e]·(1−b)^harm_power); 0 at b = 1."""
        ce = self.for_class(task_class)
        b = np.asarray(budget, dtype=np.float64)
        mult = float(self.evictor_harm.get(evictor, 1.0))
        return np.clip(ce.harm_scale * mult * (1.0 - b) ** ce.harm_power, 0.0, 1.0)

    def recovery_probability(self, task_class: str, budget) -> np.ndarray:
        """r_c(b) = min(1, recovery_scale·4b(1−b)); 0 at b = 1."""
        ce = self.for_class(task_class)
        b = np.asarray(budget, dtype=np.float64)
        return np.clip(ce.recovery_scale * 4.0 * b * (1.0 - b), 0.0, 1.0)

    def to_dict(self) -> dict:
        return {
            "capacity_bound": asdict(self.capacity_bound),
            "dilution_prone": asdict(self.dilution_prone),
            "evictor_harm": dict(self.evictor_harm),
        }

