"""Seeded, schema-v1-valid synthetic PAGE logs with a planted task partition.

:func:`synthetic_logs` draws runs that look like a collector's output (docs/SCHEMA.md) but whose
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
:func:`pagestats.core.profile.bin_layers`): the target profile decays with depth by exactly
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
  stored Jaccards equal what :func:`pagestats.core.profile.agreement_from_topk` computes from
  these lists (the tests check this bit for bit). Needs ``n_tokens ≥ (H+1)·k_max``.
- ``with_topk=False`` (fast path, used at 10⁶ inputs): only the intersections are formed
  (bits packed in 32-bit words, AND and popcount per pair), in chunks of inputs.

``agreement`` is the float32 of the float64 layer mean of the pair Jaccards; ``drop`` is
:func:`pagestats.core.profile.drop_from_agreement` of the stored float32 ``agreement``, so a
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
  kept count is ``n_kept = max(⌊b·T⌋, n_sink + n_recent)`` (docs/COLLECTION.md, App. A.2.3).

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

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from pagestats.core import defaults, schema
from pagestats.io.logs import Logs

# fmt: off
from pagestats.testing.checks import (
    _check_budgets,
    _crc,
    _int_list,
    _manifest,
    _model_specs,
    _n_references,
    _run_id,
    _str_list,
    _task_classes,
)
from pagestats.testing.draw import (
    _draw_cell,
)
from pagestats.testing.frames import (
    _cell_frames,
)
from pagestats.testing.params import (
    DEFAULT_CREATED_AT,
    DEFAULT_MODELS,
    SYNTHETIC_TASKS,
    ModelSpec,
    PlantedEffect,
)

# fmt: on


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


@dataclass(kw_only=True)
class SyntheticLogs(Logs):
    """Synthetic logs in memory: schema-v1 frames plus the planted truth, read as any
    :class:`pagestats.io.Logs` is.

    Attributes
    ----------
    inputs, outcomes : polars.DataFrame
        Exactly the INPUTS / OUTCOMES columns of :mod:`pagestats.core.schema` (writer's types
        after :func:`pagestats.core.schema.to_arrow`).
    topk : polars.DataFrame or None
        TOPK rows (one per input, layer, head) when generated with ``with_topk=True``.
    manifests : dict
        run_id → manifest dict (``files`` is filled by :meth:`write`).
    effect, task_classes, n_references
        The planted parameters, for :meth:`planted_rates`.
    """

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
        :func:`pagestats.core.schema.write_parquet` / :func:`pagestats.core.schema.write_manifest`.

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
    input_draws: Sequence[int] = (0,),
    budgets: Sequence[float] = defaults.BUDGETS,
    k_max: int = 64,
    with_topk: bool = True,
    with_text: bool = True,
    seed: int = 0,
    effect: PlantedEffect | None = None,
    n_references: Mapping[str, int] | None = None,
    created_at: str = DEFAULT_CREATED_AT,
    mode: str = defaults.MODE,
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
        task → class; default :func:`pagestats.core.defaults.default_task_class`.
    n_inputs : int
        Inputs per (run, task).
    input_draws : sequence of int
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
    mode : {"query-aware", "query-agnostic"}
        The manifest's collection ``mode`` (docs/SCHEMA.md); a query-agnostic run's run_id
        ends in ``-agnostic``, so it can sit beside the query-aware run of the same cell.
        Only the label differs: the draws are the same rule.

    Returns
    -------
    SyntheticLogs
    """
    effect = effect or PlantedEffect()
    specs = _model_specs(models)
    contexts = _int_list(context_lengths, "context_lengths", minimum=1)
    input_draws = _int_list(input_draws, "input_draws", minimum=0)
    evictors = _str_list(evictors, "evictors")
    tasks = _str_list(tasks, "tasks")
    classes = _task_classes(tasks, task_classes)
    nref = _n_references(tasks, n_references)
    budgets = _check_budgets(budgets)
    if not isinstance(n_inputs, (int, np.integer)) or n_inputs < 1:
        raise ValueError(f"n_inputs must be a positive integer, got {n_inputs!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if mode not in defaults.MODES:
        raise ValueError(f"mode must be one of {list(defaults.MODES)}, got {mode!r}")
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
            for draw in input_draws:
                run_id = _run_id(spec.name, ctx, draw) + ("" if mode == defaults.MODE else "-agnostic")
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
                manifests[run_id] = {**_manifest(
                    run_id, spec, ctx, draw, classes, evictors, budgets, k_max if with_topk else 0,
                    seed, effect, nref, created_at,
                ), "mode": mode}  # fmt: skip
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
