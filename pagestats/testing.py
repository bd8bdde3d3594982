"""Seeded, schema-v1-valid synthetic PAGE logs with a planted task partition.

:func:`synthetic_logs` draws runs that look like a collector's output (DESIGN §3) but whose
ground truth is known: every capacity-bound input has a low drop D and is harmed by
eviction with a documented probability, every dilution-prone input has a high D and is
sometimes *recovered* by eviction. :func:`planted_rates` returns those true per-(task,
evictor, budget) probabilities, so tests of the replay, metrics and statistics layers can
check their estimates against the generating parameters instead of against themselves.

Generative rule
---------------
Everything below is drawn independently per input ``x`` of a task with class ``c``
(capacity-bound or dilution-prone), with the class parameters of :class:`ClassEffect`.

*Profile* (§3 "Head-Agreement Drop D", Eq. 3). A target drop ``d ~ Normal(drop_mean,
drop_sd)`` and a late-layer agreement level ``base ~ Uniform(level_low, level_high)`` give
the target agreement ``J*_ℓ = clip(base + d·s_ℓ, 0.005, 0.95)``, where ``s_ℓ`` is linear
in depth and normalised so that its early-bin mean is 1 and its late-bin mean 0 (bins of
:func:`pagestats.profile.bin_layers`): the target profile decays with depth by exactly
``d``. Slot ``s`` of head ``h``'s ranked top-k list in layer ℓ is *shared* with probability
``σ_ℓ = round(√π_ℓ·2¹⁰)/2¹⁰`` (:data:`SIGMA_BITS`), ``π_ℓ = 2J*_ℓ/(1+J*_ℓ)``, independently per (head, slot).
A shared slot holds the layer's anchor position for that slot, an unshared one a position
private to the head, so two heads' first k entries (k = ``defaults.TOP_K``) intersect in
exactly the slots both share: ``i ~ Binomial(k, σ_ℓ²)``, Jaccard ``i/(2k−i)`` with mean ≈
``J*_ℓ``, and the realised D has mean ≈ ``drop_mean`` (the convexity of ``i/(2k−i)``
biases it by a few 10⁻³). Pairs of one layer are correlated through their heads.

The sharing bits of the first k slots are always drawn (the same way), so ``pair_jaccard``,
``agreement`` and ``drop`` do not depend on ``with_topk``:

- ``with_topk=True``: the lists are materialised. Per (input, layer) a pool of
  ``(H+1)·k_max`` distinct positions in ``[0, n_tokens)`` is split into ``k_max`` anchors
  and ``H`` disjoint private lists, and slots k..k_max get their own sharing bits. The
  stored Jaccards equal what :func:`pagestats.profile.agreement_from_topk` computes from
  these lists (the tests check this bit for bit). Needs ``n_tokens ≥ (H+1)·k_max``.
- ``with_topk=False`` (fast path, used at 10⁶ inputs): only the intersections are formed
  (bits packed in 32-bit words, AND and popcount per pair), in chunks of inputs.

``agreement`` is the float32 of the float64 layer mean of the pair Jaccards; ``drop`` is
:func:`pagestats.profile.drop_from_agreement` of the stored float32 ``agreement``, so a
replay of the logged defaults reproduces it bit for bit.

*Outcomes.* A task has ``m`` references (:data:`DEFAULT_N_REFERENCES`, else 1); scores are
RULER ``string_match_all`` fractions ``j/m``.

- Full KV: correct (``full_score = 1``) with probability ``p_full``; otherwise
  ``full_score = j/m`` with ``j`` uniform on ``{0, …, m−1}``.
- Per (input, evictor) two latent uniforms ``u`` (harm) and ``v`` (recovery). At budget
  ``b`` a full-correct input is *harmed* iff ``u < h_{c,e}(b)`` with
  ``h_{c,e}(b) = min(1, harm_scale · evictor_harm[e] · (1−b)^harm_power)``; its score is then
  ``j_b/m``, ``j_b`` uniform on ``{0, …, m−1}``, drawn per budget. A full-wrong input is
  *recovered* iff ``v < r_c(b)`` with ``r_c(b) = min(1, recovery_scale · 4b(1−b))``; its
  score is then 1. Otherwise ``score = full_score``. Because ``u`` and ``v`` are shared
  across budgets, harm is nested (harmed at b ⇒ harmed at every smaller budget with larger
  ``h``) and recovery happens at *some* budget iff ``v < max_b r_c(b)``.
- Hence (:func:`planted_rates`): harm probability ``Pr[A(b,x) < A(1,x)] = p_full·h_{c,e}(b)``
  (Table 27), recovery probability at b ``Pr[A(b,x) > A(1,x)] = (1−p_full)·r_c(b)``, and
  ρ (Eq. 1) ``= (1−p_full)·max_{b<1 in the grid} r_c(b)``. With the defaults ρ = 0 for
  capacity-bound tasks and 0.12 for dilution-prone ones (grid containing b = 0.5).
- Budget 1.0 reproduces the full-KV outcome (``h = r = 0``; ``n_kept = n_tokens``); the
  kept count is ``n_kept = max(⌊b·T⌋, n_sink + n_recent)`` (DESIGN §7, App. A.2.3).

*Signals* (struct of float64): ``attention_entropy`` and ``top1_mass`` are informative
(shifted by +0.8 and −0.08 for dilution-prone inputs, sd 0.4 and 0.05), ``sink_mass`` and
``key_norm_cv`` are pure noise, ``mean_agreement`` is the layer mean of ``agreement``.
Timings are plausible positive numbers with no meaning.

Random streams are derived from ``seed`` and the cell (model, context, draw, task) through
:class:`numpy.random.SeedSequence`, one child stream per component (profile, top-k,
outcomes, text, signals): the same seed gives byte-identical files, and switching
``with_topk`` or ``with_text`` does not change any other column.

References
----------
PAGE paper: §3 (a_ℓ, D, Eq. 3), Eq. 1 (ρ), §4 "Setup" (budgets, sinks, tasks), Table 27
(harm rate), App. A.2.3 (protection overrides the budget), App. A.7.3 (input-draw
replicates), App. F (deployed bins).
"""

from __future__ import annotations

import math
import platform
import re
import shutil
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pagestats import __version__, defaults, profile, schema

#: The eight RULER tasks drawn by default (a subset of ``defaults.RULER_TASKS``).
SYNTHETIC_TASKS = tuple(t for t in defaults.RULER_TASKS if t not in ("cwe", "qa_1", "qa_2"))
#: References per input (RULER ``string_match_all`` scores are multiples of 1/m); tasks
#: not listed have one reference.
DEFAULT_N_REFERENCES = {"niah_multivalue": 4, "niah_multiquery": 4, "vt": 5, "fwe": 3, "cwe": 10}
#: Fixed ``created_at`` so that a seed gives byte-identical manifests.
DEFAULT_CREATED_AT = "2000-01-01T00:00:00+00:00"
SIGNAL_NAMES = ("attention_entropy", "top1_mass", "sink_mass", "key_norm_cv", "mean_agreement")

_WORD_CHUNK = 1 << 20  # sharing words (or pair words) per chunk (bounds peak memory)
#: Binary digits of the slot-sharing probability σ_ℓ (σ is a multiple of 2^-SIGMA_BITS).
SIGMA_BITS = 10
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


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


#: The paper-scale log set of DESIGN §8 used by the benchmarks: 4 models × 4 evictors = 16 cells,
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
    """Planted parameters of one task class (see the module docstring for the rule).

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


def planted_rates(
    *,
    tasks: Sequence[str] = SYNTHETIC_TASKS,
    task_classes: Mapping[str, str] | None = None,
    evictors: Sequence[str] = defaults.EVICTORS,
    budgets: Sequence[float] = defaults.BUDGETS,
    effect: PlantedEffect | None = None,
    n_references: Mapping[str, int] | None = None,
) -> pl.DataFrame:
    """True per-(task, evictor, budget) probabilities of the generative rule.

    Returns
    -------
    polars.DataFrame
        Columns ``task, task_class, evictor, budget, n_references, p_full, acc_full,
        harm_probability`` (Pr[A(b,x) < A(1,x)], Table 27), ``recovery_probability``
        (Pr[A(b,x) > A(1,x)]), ``acc_plain`` (E[A(b,x)]), ``rho`` (Eq. 1, Pr[max_b A(b,x) >
        A(1,x)] over the budgets of the grid), ``drop_mean`` (planted target mean of D).

    Notes
    -----
    With j uniform on {0..m−1} a wrong answer scores (m−1)/(2m) on average, so
    ``acc_full = p_full + (1−p_full)(m−1)/(2m)`` and
    ``acc_plain(b) = p_full(1−h) + p_full·h·(m−1)/(2m) + (1−p_full)(r + (1−r)(m−1)/(2m))``.
    """
    effect = effect or PlantedEffect()
    tasks = list(tasks)
    classes = _task_classes(tasks, task_classes)
    nref = _n_references(tasks, n_references)
    budgets = _check_budgets(budgets)
    b = np.asarray(budgets)
    rows = []
    for t in tasks:
        c = classes[t]
        ce = effect.for_class(c)
        m = nref[t]
        wrong = (m - 1) / (2 * m)
        r = effect.recovery_probability(c, b)
        rho = (1 - ce.p_full) * float(r[b < 1].max(initial=0.0))
        for e in evictors:
            h = effect.harm_probability(c, b, e)
            for bi in range(len(b)):
                rows.append(
                    {
                        "task": t,
                        "task_class": c,
                        "evictor": e,
                        "budget": float(b[bi]),
                        "n_references": m,
                        "p_full": ce.p_full,
                        "acc_full": ce.p_full + (1 - ce.p_full) * wrong,
                        "harm_probability": ce.p_full * float(h[bi]),
                        "recovery_probability": (1 - ce.p_full) * float(r[bi]),
                        "acc_plain": ce.p_full * (1 - h[bi])
                        + ce.p_full * h[bi] * wrong
                        + (1 - ce.p_full) * (r[bi] + (1 - r[bi]) * wrong),
                        "rho": rho,
                        "drop_mean": ce.drop_mean,
                    }
                )
    return pl.DataFrame(rows)


@dataclass
class SyntheticLogs:
    """Synthetic logs in memory: schema-v1 frames plus the planted truth.

    Attributes
    ----------
    inputs, outcomes : polars.DataFrame
        Exactly the INPUTS / OUTCOMES columns of :mod:`pagestats.schema` (writer's types
        after :func:`pagestats.schema.to_arrow`).
    topk : polars.DataFrame or None
        TOPK rows (one per input, layer, head) when generated with ``with_topk=True``.
    manifests : dict
        run_id → manifest dict (``files`` is filled by :meth:`write`).
    effect, task_classes, n_references
        The planted parameters, for :meth:`planted_rates`.
    """

    inputs: pl.DataFrame
    outcomes: pl.DataFrame
    topk: pl.DataFrame | None
    manifests: dict[str, dict]
    effect: PlantedEffect
    task_classes: dict[str, str]
    n_references: dict[str, int]
    evictors: tuple[str, ...]
    budgets: tuple[float, ...]

    def planted_rates(self) -> pl.DataFrame:
        """:func:`planted_rates` for these logs' tasks, classes, evictors and budgets."""
        return planted_rates(
            tasks=list(self.task_classes),
            task_classes=self.task_classes,
            evictors=self.evictors,
            budgets=self.budgets,
            effect=self.effect,
            n_references=self.n_references,
        )

    def write(self, root, *, n_shards: int = 2, overwrite: bool = False) -> list[Path]:
        """Write one run directory per run_id under ``root``; return the run directories.

        Each run gets ``inputs/part-XXXXX.parquet`` and ``outcomes/part-XXXXX.parquet``
        (``n_shards`` files each, split by input), ``topk/part-XXXXX.parquet`` when top-k
        lists exist, and ``manifest.json`` with file hashes, all through
        :func:`pagestats.schema.write_parquet` / :func:`pagestats.schema.write_manifest`.

        Raises
        ------
        FileExistsError
            If a run directory exists and is not empty, unless ``overwrite=True`` (which
            removes it first).
        """
        if not isinstance(n_shards, int) or n_shards < 1:
            raise ValueError(f"n_shards must be a positive integer, got {n_shards!r}")
        root = Path(root)
        run_dirs = {run_id: root / run_id for run_id in self.manifests}
        for run_dir in run_dirs.values():
            if run_dir.exists() and any(run_dir.iterdir()):
                if not overwrite:
                    raise FileExistsError(f"{run_dir} exists and is not empty (pass overwrite=True)")
                shutil.rmtree(run_dir)
        # shard s of a run holds the inputs with input_id in [s·N/n_shards, (s+1)·N/n_shards) of
        # every task, and their outcome and top-k rows: one vectorised key, one partition pass
        n_ids = int(self.inputs["input_id"].max()) + 1
        shard = (pl.col("input_id") * n_shards // n_ids).alias("_shard")
        for name, frame in (("inputs", self.inputs), ("outcomes", self.outcomes), ("topk", self.topk)):
            if frame is None:
                continue
            parts = frame.with_columns(shard).partition_by(["run_id", "_shard"], as_dict=True, include_key=False)
            for (run_id, s), part in parts.items():
                part = part.with_columns(pl.lit(run_id).alias("run_id"))
                schema.write_parquet(name, part, run_dirs[run_id] / name / f"part-{s:05d}.parquet")
        for run_id, manifest in self.manifests.items():
            schema.write_manifest(run_dirs[run_id], manifest)
        return list(run_dirs.values())


def synthetic_logs(
    *,
    models: Sequence[ModelSpec] | Mapping[str, object] | ModelSpec = DEFAULT_MODELS,
    context_lengths: Sequence[int] = (4096,),
    evictors: Sequence[str] = defaults.EVICTORS,
    tasks: Sequence[str] = SYNTHETIC_TASKS,
    task_classes: Mapping[str, str] | None = None,
    n_inputs: int = 20,
    draws: Sequence[int] = (0,),
    budgets: Sequence[float] = defaults.BUDGETS,
    k_max: int = 64,
    with_topk: bool = True,
    with_text: bool = True,
    seed: int = 0,
    effect: PlantedEffect | None = None,
    n_references: Mapping[str, int] | None = None,
    created_at: str = DEFAULT_CREATED_AT,
) -> SyntheticLogs:
    """Draw seeded schema-v1 logs with a planted capacity-bound / dilution-prone partition.

    One run per (model, context_length, draw); every run holds ``n_inputs`` inputs of each
    task, each with one outcome row per (evictor, budget). The generative rule is spelled
    out in the module docstring; :func:`planted_rates` gives its true probabilities.

    Parameters
    ----------
    models : sequence of ModelSpec, ModelSpec, or mapping
        Model shapes. A mapping goes from name to a ModelSpec, a ``(n_layers, n_heads)``
        tuple or a dict of ModelSpec fields.
    context_lengths : sequence of int
        Target context lengths; ``n_tokens`` is drawn in ``(ctx − ctx//64, ctx]``.
    evictors : sequence of str
        Base evictor names (default ``defaults.EVICTORS``).
    tasks : sequence of str
        Task names (default :data:`SYNTHETIC_TASKS`).
    task_classes : mapping, optional
        task → class; default :func:`pagestats.defaults.default_task_class`.
    n_inputs : int
        Inputs per (run, task).
    draws : sequence of int
        Input-draw seeds; each is a replicate run (App. A.7.3), recorded in ``draw``.
    budgets : sequence of float
        Nominal budgets in (0, 1]; must contain 1.0 (the full-KV audit arm).
    k_max : int
        Top-k indices stored per (layer, head) when ``with_topk``; ≥ ``defaults.TOP_K``.
    with_topk : bool
        Draw top-k lists and derive the Jaccards from them (slower); otherwise the fast path.
    with_text : bool
        Fill ``prompt``, ``references`` and predictions with short strings consistent with
        the scores; otherwise they are empty.
    seed : int
        Master seed (≥ 0).
    effect : PlantedEffect, optional
        Planted parameters (default :class:`PlantedEffect`).
    n_references : mapping, optional
        task → number of references m (default :data:`DEFAULT_N_REFERENCES`, else 1).
    created_at : str
        Manifest timestamp (fixed by default so files are byte-reproducible).

    Returns
    -------
    SyntheticLogs
    """
    effect = effect or PlantedEffect()
    specs = _model_specs(models)
    contexts = _int_list(context_lengths, "context_lengths", minimum=1)
    draws = _int_list(draws, "draws", minimum=0)
    evictors = _str_list(evictors, "evictors")
    tasks = _str_list(tasks, "tasks")
    classes = _task_classes(tasks, task_classes)
    nref = _n_references(tasks, n_references)
    budgets = _check_budgets(budgets)
    if not isinstance(n_inputs, (int, np.integer)) or n_inputs < 1:
        raise ValueError(f"n_inputs must be a positive integer, got {n_inputs!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    k = defaults.TOP_K
    if with_topk and (not isinstance(k_max, (int, np.integer)) or k_max < k):
        raise ValueError(f"k_max must be an integer ≥ TOP_K={k}, got {k_max!r}")
    protected = defaults.N_SINK + defaults.N_RECENT
    for spec in specs:
        for ctx in contexts:
            t_min = ctx - max(1, ctx // 64) + 1
            if t_min < protected:
                raise ValueError(f"context_length {ctx} is shorter than the {protected} protected positions")
            need = (spec.n_heads + 1) * k_max
            if with_topk and t_min < need:
                raise ValueError(
                    f"with_topk needs n_tokens ≥ (n_heads+1)·k_max = {need} for {spec.name}, "
                    f"but context_length {ctx} can give {t_min}; lower k_max or use with_topk=False"
                )

    inputs, outcomes, topk, manifests = [], [], [], {}
    for spec in specs:
        for ctx in contexts:
            for draw in draws:
                run_id = _run_id(spec.name, ctx, draw)
                if run_id in manifests:
                    raise ValueError(f"two runs map to the run_id {run_id!r}; rename the models")
                for task in tasks:
                    ss = np.random.SeedSequence(
                        entropy=int(seed), spawn_key=(_crc(spec.name), int(ctx), int(draw), _crc(task))
                    )
                    cell = _draw_cell(
                        ss,
                        spec=spec,
                        ctx=int(ctx),
                        n=int(n_inputs),
                        task_class=classes[task],
                        m=nref[task],
                        evictors=evictors,
                        budgets=budgets,
                        effect=effect,
                        k_max=int(k_max),
                        with_topk=with_topk,
                    )
                    ids = {"run_id": run_id, "model": spec.name, "context_length": ctx, "task": task, "draw": draw}
                    i_frame, o_frame, t_frame = _cell_frames(cell, ids, evictors, budgets, with_text)
                    inputs.append(i_frame)
                    outcomes.append(o_frame)
                    if t_frame is not None:
                        topk.append(t_frame)
                manifests[run_id] = _manifest(
                    run_id, spec, ctx, draw, classes, evictors, budgets, k_max if with_topk else 0,
                    seed, effect, nref, created_at,
                )  # fmt: skip
    return SyntheticLogs(
        inputs=pl.concat(inputs, how="vertical"),
        outcomes=pl.concat(outcomes, how="vertical"),
        topk=pl.concat(topk, how="vertical") if topk else None,
        manifests=manifests,
        effect=effect,
        task_classes=classes,
        n_references=nref,
        evictors=tuple(evictors),
        budgets=tuple(budgets),
    )


# --------------------------------------------------------------------------- drawing


def profile_shape(n_layers: int) -> np.ndarray:
    """Linear depth shape s_ℓ with early-bin mean 1 and late-bin mean 0 (deployed bins, App. F)."""
    s = 1.0 - np.arange(n_layers) / (n_layers - 1)
    early, late = profile.bin_layers(n_layers)
    return (s - s[late].mean()) / (s[early].mean() - s[late].mean())


def _draw_cell(ss, *, spec, ctx, n, task_class, m, evictors, budgets, effect, k_max, with_topk) -> dict:
    """All numeric arrays of one (model, context, draw, task) cell."""
    rng_profile, rng_topk, rng_outcome, rng_text, rng_signal = (np.random.default_rng(s) for s in ss.spawn(5))
    ce = effect.for_class(task_class)
    L, H, k = spec.n_layers, spec.n_heads, defaults.TOP_K
    n_tokens = ctx - rng_profile.integers(0, max(1, ctx // 64), size=n)

    # target profile and per-pair overlap probability π_ℓ
    d = rng_profile.normal(ce.drop_mean, ce.drop_sd, size=n)
    base = rng_profile.uniform(ce.level_low, ce.level_high, size=n)
    target = np.clip(base[:, None] + d[:, None] * profile_shape(L)[None, :], 0.005, 0.95)
    pi = 2.0 * target / (1.0 + target)

    top = 2**SIGMA_BITS - 1
    sigma = np.clip(np.rint(np.sqrt(pi) * 2**SIGMA_BITS), 1, top).astype(np.int64)  # σ = sigma / 2^SIGMA_BITS
    agreement, pair_jaccard, bits = _draw_profile(rng_profile, sigma, H, k, keep_bits=with_topk)
    indices = _draw_topk(rng_topk, bits, sigma, n_tokens, k_max) if with_topk else None
    drop = profile.drop_from_agreement(agreement)

    # outcomes
    E, B = len(evictors), len(budgets)
    b = np.asarray(budgets)
    full_correct = rng_outcome.random(n) < ce.p_full
    full_j = np.where(full_correct, m, rng_outcome.integers(0, m, size=n))
    u = rng_outcome.random((n, E))
    v = rng_outcome.random((n, E))
    harm_j = rng_outcome.integers(0, m, size=(n, E, B))
    h = np.stack([effect.harm_probability(task_class, b, e) for e in evictors])  # (E, B)
    r = effect.recovery_probability(task_class, b)  # (B,)
    harmed = full_correct[:, None, None] & (u[:, :, None] < h[None])
    recovered = ~full_correct[:, None, None] & (v[:, :, None] < r[None, None, :])
    j = np.where(harmed, harm_j, np.where(recovered, m, full_j[:, None, None]))
    n_kept = np.maximum(np.floor(b[None, :] * n_tokens[:, None]), defaults.N_SINK + defaults.N_RECENT)
    n_kept = np.broadcast_to(n_kept.astype(np.int64)[:, None, :], (n, E, B))

    # text (drawn even when unused so with_text changes nothing else) and signals
    ref_base = rng_text.integers(0, 9_000_000, size=n)
    references = 1_000_000 + (ref_base[:, None] + 1_299_709 * np.arange(m)[None, :]) % 9_000_000

    dil = float(task_class == defaults.DILUTION_PRONE)
    signals = {
        "attention_entropy": 4.0 + 0.8 * dil + rng_signal.normal(0, 0.4, n),
        "top1_mass": 0.25 - 0.08 * dil + rng_signal.normal(0, 0.05, n),
        "sink_mass": rng_signal.uniform(0.1, 0.5, n),
        "key_norm_cv": rng_signal.lognormal(-1.0, 0.3, n),
        "mean_agreement": agreement.astype(np.float64).mean(axis=-1),
    }
    prefill_ms = n_tokens * L * H * 2e-4 * np.exp(rng_signal.normal(0, 0.05, n))
    gate_ms = L * H * H * k * 1e-5 * np.exp(rng_signal.normal(0, 0.1, n))
    decode_ms = (20.0 + 2e-3 * n_kept) * np.exp(rng_signal.normal(0, 0.05, (n, E, B)))
    return {
        "n": n,
        "L": L,
        "H": H,
        "m": m,
        "n_tokens": n_tokens.astype(np.int64),
        "agreement": agreement,
        "pair_jaccard": pair_jaccard,
        "drop": drop,
        "full_j": full_j,
        "j": j,
        "n_kept": n_kept,
        "references": references,
        "signals": signals,
        "prefill_ms": prefill_ms,
        "gate_ms": gate_ms,
        "decode_ms": decode_ms,
        "indices": indices,
    }


def _sharing_words(rng, sigma: np.ndarray, n_heads: int, n_slots: int) -> np.ndarray:
    """Slot-sharing bits packed in uint32 words, shape (n, L, H, ⌈n_slots/32⌉).

    Bit s of a head's words is 1 with probability ``sigma / 2^SIGMA_BITS`` (``sigma`` an
    integer array (n, L)), independently per bit: the dyadic digits of σ are folded in from
    the least significant one, ``x ← d_j ? (w | x) : (w & x)`` with a fresh fair word ``w``
    per digit, so that Pr[bit] = (d_j + Pr_before)/2 at each step.
    """
    n, L = sigma.shape
    n_words = -(-n_slots // 32)
    shape = (n, L, n_heads, n_words)
    raw = rng.integers(0, 2**32, size=(SIGMA_BITS, *shape), dtype=np.uint32)
    x = np.zeros(shape, dtype=np.uint32)
    for j in range(SIGMA_BITS):
        keep = np.where((sigma >> j) & 1, np.uint32(0xFFFFFFFF), np.uint32(0))[:, :, None, None]
        w = raw[j]
        either = w | x
        either &= keep
        x &= w
        x |= either
    if n_slots % 32:
        x[..., -1] &= np.uint32((1 << (n_slots % 32)) - 1)
    return x


def _unpack(words: np.ndarray, n_slots: int) -> np.ndarray:
    """Sharing words → bool (n, L, H, n_slots), slot s = bit s."""
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :n_slots].astype(bool)


def _intersections(words: np.ndarray) -> np.ndarray:
    """|S_h ∩ S_g| of the shared-slot sets of every (i<j) head pair, (n, L, P) int64, by popcount."""
    pairs = profile.pair_index(words.shape[2])
    both = np.ascontiguousarray(words[:, :, pairs[:, 0]] & words[:, :, pairs[:, 1]])
    if hasattr(np, "bitwise_count"):  # NumPy ≥ 2.0
        count = np.bitwise_count(both)
    else:
        count = _POPCOUNT8[both.view(np.uint8)].reshape(*both.shape[:-1], -1)
    if count.shape[-1] == 1:
        return count[..., 0].astype(np.int64)
    return count.sum(axis=-1, dtype=np.int64)


def _stored_profile(inter: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(agreement float32 (n, L), pair_jaccard float32 (n, L·P)) from intersections (n, L, P).

    Same arithmetic as :func:`pagestats.profile.agreement_from_topk`: Jaccard in float64,
    layer mean in float64, then stored as float32.
    """
    jac = profile.jaccard_from_intersections(inter, k)
    return jac.mean(axis=-1).astype(np.float32), jac.astype(np.float32).reshape(inter.shape[0], -1)


def _draw_profile(rng, sigma: np.ndarray, n_heads: int, k: int, keep_bits: bool):
    """Sharing bits of the first k slots, drawn in input chunks; stored profiles (+ the bits)."""
    n, L = sigma.shape
    P = profile.n_pairs(n_heads)
    agreement = np.empty((n, L), dtype=np.float32)
    pair_jaccard = np.empty((n, L * P), dtype=np.float32)
    bits = np.empty((n, L, n_heads, k), dtype=bool) if keep_bits else None
    step = max(1, _WORD_CHUNK // (L * max(P, n_heads) * -(-k // 32)))
    for start in range(0, n, step):
        sl = slice(start, start + step)
        words = _sharing_words(rng, sigma[sl], n_heads, k)
        agreement[sl], pair_jaccard[sl] = _stored_profile(_intersections(words), k)
        if keep_bits:
            bits[sl] = _unpack(words, k)
    return agreement, pair_jaccard, bits


def _draw_topk(rng, shared_k, sigma, n_tokens, k_max) -> np.ndarray:
    """Top-k_max lists (n, L, H, k_max) int32 from the first-k sharing bits plus new slots k..k_max."""
    n, L, H, k = shared_k.shape
    extra = _unpack(_sharing_words(rng, sigma, H, k_max - k), k_max - k) if k_max > k else shared_k[..., :0]
    shared = np.concatenate([shared_k, extra], axis=-1)
    size = (H + 1) * k_max
    gap = n_tokens // size  # ≥ 1, checked by the caller
    inc = rng.integers(1, gap[:, None, None] + 1, size=(n, L, size))
    pool = np.cumsum(inc, axis=-1)
    offset = rng.integers(0, n_tokens[:, None] - pool[..., -1] + 1)  # keeps max position ≤ T−1
    pool += offset[..., None] - 1
    pool = rng.permuted(pool, axis=-1)
    anchors = pool[..., :k_max]
    private = pool[..., k_max:].reshape(n, L, H, k_max)
    return np.where(shared, anchors[:, :, None, :], private).astype(np.int32)


# --------------------------------------------------------------------------- frames


def _list_column(name: str, values: np.ndarray, dtype) -> pl.Series:
    """A 2-D array as a polars List column (one row per array row)."""
    return pl.Series(name, np.ascontiguousarray(values)).cast(pl.List(dtype))


def _empty_lists(name: str) -> pl.Expr:
    return pl.lit(pl.Series(name, [[]], dtype=pl.List(pl.String))).first().alias(name)


def _cell_frames(cell, ids, evictors, budgets, with_text):
    n, m, L, H = cell["n"], cell["m"], cell["L"], cell["H"]
    E, B = len(evictors), len(budgets)
    lits = [pl.lit(ids[c]).alias(c) for c in ("run_id", "model", "task")]
    inputs = pl.DataFrame(
        {
            "input_id": np.arange(n, dtype=np.int64),
            "draw": np.full(n, ids["draw"], dtype=np.int64),
            "context_length": np.full(n, ids["context_length"], dtype=np.int64),
            "n_tokens": cell["n_tokens"],
            "drop": cell["drop"],
            "full_score": cell["full_j"] / m,
            "prefill_ms": cell["prefill_ms"],
            "gate_ms": cell["gate_ms"],
            **{f"_s_{k}": v for k, v in cell["signals"].items()},
        }
    ).with_columns(
        _list_column("agreement", cell["agreement"], pl.Float32),
        _list_column("pair_jaccard", cell["pair_jaccard"], pl.Float32),
        pl.struct([pl.col(f"_s_{k}").alias(k) for k in SIGNAL_NAMES]).alias("signals"),
        *lits,
    )
    row_of_outcome = np.repeat(np.arange(n), E * B)
    outcomes = pl.DataFrame(
        {
            "input_id": row_of_outcome.astype(np.int64),
            "evictor": pl.Series(list(evictors)).gather(np.tile(np.repeat(np.arange(E), B), n)),
            "budget": np.tile(np.asarray(budgets, dtype=np.float64), n * E),
            "n_kept": cell["n_kept"].reshape(-1),
            "score": (cell["j"] / m).reshape(-1),
            "decode_ms": cell["decode_ms"].reshape(-1),
        }
    ).with_columns(lits[0], lits[2])
    if with_text:
        refs = _list_column("references", cell["references"], pl.Int64).cast(pl.List(pl.String))
        inputs = inputs.with_columns(
            refs,
            pl.format(
                "<|user|> Synthetic {} input {} (draw {}, {} tokens). What are the special magic numbers? "
                "<|assistant|> Answer:",
                pl.lit(ids["task"]),
                pl.col("input_id"),
                pl.col("draw"),
                pl.col("n_tokens"),
            ).alias("prompt"),
            _prediction(refs, pl.Series(cell["full_j"])).alias("full_prediction"),
        )
        outcomes = outcomes.with_columns(
            _prediction(refs.gather(row_of_outcome), pl.Series(cell["j"].reshape(-1))).alias("prediction")
        )
    else:
        inputs = inputs.with_columns(
            _empty_lists("references"), pl.lit("").alias("prompt"), pl.lit("").alias("full_prediction")
        )
        outcomes = outcomes.with_columns(pl.lit("").alias("prediction"))
    inputs = inputs.select([c.name for c in schema.INPUTS])
    outcomes = outcomes.select([c.name for c in schema.OUTCOMES])

    topk = None
    if cell["indices"] is not None:
        k_max = cell["indices"].shape[-1]
        topk = pl.DataFrame(
            {
                "input_id": np.repeat(np.arange(n, dtype=np.int64), L * H),
                "layer": np.tile(np.repeat(np.arange(L, dtype=np.int64), H), n),
                "head": np.tile(np.arange(H, dtype=np.int64), n * L),
            }
        ).with_columns(_list_column("indices", cell["indices"].reshape(-1, k_max), pl.Int32), lits[0], lits[2])
        topk = topk.select([c.name for c in schema.TOPK])
    return inputs, outcomes, topk


def _prediction(refs: pl.Series, n_found: pl.Series) -> pl.Series:
    """'Answer: r1, r2' with the first ``n_found`` references (string_match_all = n_found/m)."""
    frame = pl.DataFrame({"r": refs, "j": n_found})
    return frame.select(pl.lit("Answer: ") + pl.col("r").list.head(pl.col("j")).list.join(", ")).to_series()


# --------------------------------------------------------------------------- checks & metadata


def _manifest(run_id, spec, ctx, draw, classes, evictors, budgets, k_max, seed, effect, nref, created_at) -> dict:
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "created_at": created_at,
        "model": spec.manifest(),
        "device": "synthetic",
        "context_length": int(ctx),
        "tasks": dict(classes),
        "evictors": list(evictors),
        "budgets": list(budgets),
        "gate": {
            "w": defaults.WINDOW,
            "k": defaults.TOP_K,
            "k_max_stored": int(k_max),
            "bins": defaults.BIN_FRACTION,
            "bin_convention": defaults.BIN_CONVENTION,
        },
        "protection": {"n_sink": defaults.N_SINK, "n_recent": defaults.N_RECENT},
        "seed": int(seed),
        "draw": int(draw),
        "software": {
            "python": platform.python_version(),
            "torch": None,
            "transformers": None,
            "pagestats": __version__,
            "numpy": np.__version__,
        },
        "synthetic": {
            "generator": "pagestats.testing.synthetic_logs",
            "effect": effect.to_dict(),
            "n_references": dict(nref),
        },
    }


def _run_id(model: str, ctx: int, draw: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"syn-{model}-{ctx}-d{draw}")


def _crc(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def _model_specs(models) -> list[ModelSpec]:
    if isinstance(models, ModelSpec):
        models = [models]
    if isinstance(models, Mapping):
        specs = []
        for name, value in models.items():
            if isinstance(value, ModelSpec):
                specs.append(value if value.name == name else ModelSpec(**{**asdict(value), "name": name}))
            elif isinstance(value, Mapping):
                specs.append(ModelSpec(name=name, **value))
            elif isinstance(value, Sequence) and len(value) == 2:
                specs.append(ModelSpec(name, int(value[0]), int(value[1])))
            else:
                raise ValueError(f"model {name!r}: expected a ModelSpec, a dict or (n_layers, n_heads), got {value!r}")
    else:
        specs = list(models)
    if not specs or not all(isinstance(s, ModelSpec) for s in specs):
        raise ValueError("models must be a non-empty sequence of ModelSpec (or a mapping name → shape)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate model names in {names}")
    for s in specs:
        if s.n_layers < 2 or s.n_heads < 2:
            raise ValueError(f"model {s.name!r}: need n_layers ≥ 2 and n_heads ≥ 2, got {s.n_layers}, {s.n_heads}")
    return specs


def _int_list(values, name: str, minimum: int) -> list[int]:
    out = list(values)
    if not out or not all(isinstance(v, (int, np.integer)) and v >= minimum for v in out):
        raise ValueError(f"{name} must be a non-empty sequence of integers ≥ {minimum}, got {values!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has duplicates: {values!r}")
    return [int(v) for v in out]


def _str_list(values, name: str) -> list[str]:
    if isinstance(values, str):
        raise ValueError(f"{name} must be a sequence of names, not the string {values!r}")
    out = list(values)
    if not out or not all(isinstance(v, str) and v for v in out) or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty sequence of distinct names, got {values!r}")
    return out


def _task_classes(tasks, task_classes) -> dict[str, str]:
    allowed = (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE)
    if task_classes is None:
        return {t: defaults.default_task_class(t) for t in tasks}
    missing = [t for t in tasks if t not in task_classes]
    if missing:
        raise ValueError(f"task_classes has no class for {missing}")
    bad = {t: task_classes[t] for t in tasks if task_classes[t] not in allowed}
    if bad:
        raise ValueError(f"task_classes values must be one of {allowed}, got {bad}")
    return {t: task_classes[t] for t in tasks}


def _n_references(tasks, n_references) -> dict[str, int]:
    given = dict(DEFAULT_N_REFERENCES if n_references is None else n_references)
    out = {t: int(given.get(t, 1)) for t in tasks}
    bad = {t: m for t, m in out.items() if m < 1}
    if bad:
        raise ValueError(f"n_references must be ≥ 1, got {bad}")
    return out


def _check_budgets(budgets) -> list[float]:
    b = [float(x) for x in budgets]
    if not b or any(not 0.0 < x <= 1.0 for x in b) or len(set(b)) != len(b):
        raise ValueError(f"budgets must be distinct values in (0, 1], got {budgets!r}")
    if 1.0 not in b:
        raise ValueError("budgets must contain 1.0 (the full-KV audit arm, DESIGN §3)")
    return sorted(b)
