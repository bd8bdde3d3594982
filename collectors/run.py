"""The collection loop: one input → one prefill → gate signals → every arm → schema-v1 rows (docs/COLLECTION.md).

Per input (:func:`collect_input`)::

    tasks.make_input → tokenize → capture.prefill(what the evictors need: evictors.capture_options)
      → signals.gate_signals → sweep.run_sweep → tasks.score per arm → rows

In ``--mode query-agnostic`` the prefill, D and the evictions see the context only (the prompt up to
``TaskInput.question_start``); every arm then reads the question from its evicted cache. ``n_tokens``
stays the whole prompt, and ``n_kept`` counts the kept context positions plus the question tokens.

``inputs``: one row (D, a_ℓ, pair Jaccards, other signals, prompt, references, full-KV prediction
and score, timings); ``outcomes``: one row per (evictor, budget), the budget-1.0 rows included,
which must reproduce the full-KV outcome (checked: :class:`AuditError`); ``topk``: one row per
(layer, head) with the k_max top key positions of ā_{ℓ,h} (so any k ≤ k_max replays offline).

:func:`run_collection` runs a shard of a run into a directory through :class:`collectors.writer.RunWriter`
with a progress bar (inputs/s and ETA).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from collectors import capture, signals, sweep
from collectors import evictors as E
from collectors import tasks as T
from collectors.hf import hf_progress
from collectors.model import check_positions, check_windows, load_model
from collectors.tasks.haystack import file_sha256
from collectors.tasks.qa import detect_dataset
from collectors.tasks.templates import NIAH_CONFIGS, QA_CONFIGS
from collectors.writer import RunWriter, run_id_for, shard_items, software_versions, work_items
from pagestats.core import defaults


class AuditError(RuntimeError):
    """A budget-1.0 arm did not reproduce the full-KV outcome (docs/SCHEMA.md)."""


@dataclass
class CollectConfig:
    """Everything a collection run depends on (CLI options of ``pagestats-collect``)."""

    tasks: tuple[str, ...]
    context_length: int
    n: int
    out: str
    model: str | None = None
    model_name: str | None = None  # label of the model in the manifest and rows; default from --model
    seed: int = 0
    draw: int | None = None  # seed of the input draws; defaults to ``seed``
    evictors: tuple[str, ...] = defaults.EVICTORS
    budgets: tuple[float, ...] = defaults.BUDGETS
    shard: tuple[int, int] = (0, 1)
    device: str = "cpu"
    dtype: str = "float32"
    attn_impl: str = "sdpa"
    window: int = defaults.WINDOW
    k: int = defaults.TOP_K
    k_max: int = defaults.K_MAX
    bin_fraction: float = defaults.BIN_FRACTION
    convention: str = defaults.BIN_CONVENTION
    n_sink: int = defaults.N_SINK
    n_recent: int = defaults.N_RECENT
    budget_floor: str = defaults.BUDGET_FLOOR
    prompt_style: str = defaults.PROMPT_STYLE
    snapkv_window: int = defaults.SNAPKV_WINDOW
    pool_kernel: int = defaults.SNAPKV_POOL_KERNEL
    mode: str = defaults.MODE
    max_new_tokens: int | dict[str, int] | None = None  # every task, or per task (others: their default)
    allow_cut_answers: bool = False  # a limit below an input's answer is refused unless this is set
    haystack_file: str | None = None
    qa_files: tuple[str, ...] = ()
    task_classes: dict | None = None
    part_size: int = 8
    batch_arms: bool = True
    max_batch: int = 16
    progress: bool = True
    #: The evictors, parsed from their names (:func:`collectors.evictors.parse_all`).
    parsed_evictors: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.tasks = tuple(self.tasks)
        self.evictors = tuple(self.evictors)
        self.budgets = tuple(float(b) for b in self.budgets)
        self.qa_files = tuple(self.qa_files)
        unknown = [t for t in self.tasks if t not in T.TASK_NAMES]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; expected some of {', '.join(T.TASK_NAMES)}")
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be a non-empty list without repeats, got {list(self.tasks)}")
        if not self.evictors:
            raise ValueError("at least one evictor is needed")
        self.parsed_evictors = E.parse_all(self.evictors)
        if not self.budgets or any(not 0 < b <= 1 for b in self.budgets):
            raise ValueError(f"budgets must be in (0, 1], got {list(self.budgets)}")
        if self.context_length < 1 or self.n < 0:
            raise ValueError("context_length must be ≥ 1 and n ≥ 0")
        if self.k_max and self.k > self.k_max:
            raise ValueError(f"k ({self.k}) must be ≤ k_max ({self.k_max})")
        if isinstance(self.max_new_tokens, dict):
            unknown = sorted(set(self.max_new_tokens) - set(self.tasks))
            if unknown:
                raise ValueError(f"max_new_tokens names task(s) {unknown} that the run does not collect")
            self.max_new_tokens = {t: int(n) for t, n in self.max_new_tokens.items()}
        limits = (self.max_new_tokens.values() if isinstance(self.max_new_tokens, dict)
                  else [] if self.max_new_tokens is None else [self.max_new_tokens])
        if any(isinstance(n, bool) or int(n) < 1 for n in limits):
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.snapkv_window < 1:
            raise ValueError(f"snapkv_window must be ≥ 1, got {self.snapkv_window}")
        if self.mode not in defaults.MODES:
            raise ValueError(f"mode must be one of {', '.join(defaults.MODES)}, got {self.mode!r}")
        if self.prompt_style not in defaults.PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {', '.join(defaults.PROMPT_STYLES)}, "
                             f"got {self.prompt_style!r}")
        if self.budget_floor not in defaults.BUDGET_FLOORS:
            raise ValueError(f"budget_floor must be one of {', '.join(defaults.BUDGET_FLOORS)}, "
                             f"got {self.budget_floor!r}")
        essay_only = [t for t in self.tasks if t in T.ESSAY_TASKS]
        if essay_only and self.haystack_file is None:
            raise ValueError(f"{', '.join(essay_only)} need RULER's essay haystack: give a haystack file (RULER's "
                             "Paul Graham essays as plain text)")
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd int, got {self.pool_kernel}")
        if self.draw is None:
            self.draw = self.seed
        classes = {defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE}
        bad = {t: c for t, c in (self.task_classes or {}).items() if c not in classes}
        if bad:
            raise ValueError(f"task classes must be one of {sorted(classes)}, got {bad}")


    def tokens_to_generate(self, task: str) -> int:
        """The decode limit of ``task``: ``max_new_tokens`` (for every task or for this one), else the
        task's default (:data:`collectors.tasks.TASK_TOKENS_TO_GENERATE`)."""
        given = self.max_new_tokens.get(task) if isinstance(self.max_new_tokens, dict) else self.max_new_tokens
        return int(given) if given is not None else T.TASK_TOKENS_TO_GENERATE[task]


def qa_file_for(task: str, qa_files) -> str | None:
    """The user's QA file whose format matches ``task`` (qa_1: SQuAD, qa_2: HotpotQA)."""
    if task not in QA_CONFIGS:
        return None
    want = QA_CONFIGS[task]["dataset"]
    for path in qa_files:
        if detect_dataset(path) == want:
            return str(path)
    raise ValueError(f"{task} needs a {want} json file among the qa files (got {list(qa_files) or 'none'})")


def task_options(cfg: CollectConfig) -> dict:
    """Per task: RULER's haystack actually used, tokens to generate, file hashes (for the manifest)."""
    out = {}
    for task in cfg.tasks:
        ruler = NIAH_CONFIGS.get(task, {}).get("haystack")
        if task == "vt":
            ruler = "noise"
        entry = {"max_new_tokens": cfg.tokens_to_generate(task), "metric": T.metric_name(task)}
        if ruler:
            entry["ruler_haystack"] = ruler
            essay = ruler == "essay" and cfg.haystack_file
            entry["haystack"] = "essay" if essay else ("needle" if ruler == "needle" else "noise")
            if entry["haystack"] == "essay":
                entry["essay_sha256"] = file_sha256(cfg.haystack_file)
        qa_file = qa_file_for(task, cfg.qa_files)
        if qa_file:
            entry["qa_sha256"] = file_sha256(qa_file)
        out[task] = entry
    return out


def run_parameters(cfg: CollectConfig, model_info: dict) -> dict:
    """What the run id hashes: everything that changes the rows (not n, shard, device or output)."""
    return {
        "model": {k: model_info.get(k) for k in ("name", "revision", "sha256", "dtype", "attn_impl", "decode_attn_impl")},
        "context_length": int(cfg.context_length),
        "mode": cfg.mode,
        "prompt_style": cfg.prompt_style,
        "tasks": list(cfg.tasks),
        "task_options": task_options(cfg),
        "draw": int(cfg.draw),
        "seed": int(cfg.seed),
        "evictors": list(cfg.evictors),
        "budgets": list(cfg.budgets),
        "gate": {"w": cfg.window, "k": cfg.k, "k_max_stored": cfg.k_max, "bins": cfg.bin_fraction,
                 "convention": cfg.convention},
        "protection": {"n_sink": cfg.n_sink, "n_recent": cfg.n_recent, "budget_floor": cfg.budget_floor},
        "evictor_parameters": evictor_parameters(cfg),
    }


def evictor_parameters(cfg: CollectConfig) -> dict:
    """SnapKV window and pooling, and per kvpress evictor its press, parameters and kvpress version."""
    out = {"snapkv_window": cfg.snapkv_window, "pool_kernel": cfg.pool_kernel}
    presses = E.capture_options(cfg.parsed_evictors)["presses"]
    if presses:
        out["kvpress"] = {press.name: press.manifest() for press in presses}
    return out


def build_manifest(cfg: CollectConfig, model_info: dict) -> dict:
    """The manifest of docs/SCHEMA.md (``files`` is filled by the writer) plus ``parameters``."""
    params = run_parameters(cfg, model_info)
    classes = {t: (cfg.task_classes or {}).get(t, defaults.default_task_class(t)) for t in cfg.tasks}
    return {
        "run_id": run_id_for(params, label=f"{model_info.get('name', 'model')}-{cfg.context_length}"),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model_info,
        "device": cfg.device,
        "context_length": int(cfg.context_length),
        "mode": cfg.mode,
        "prompt_style": cfg.prompt_style,
        "tasks": classes,
        "evictors": list(cfg.evictors),
        "budgets": list(cfg.budgets),
        "gate": params["gate"],
        "protection": params["protection"],
        "evictor_parameters": params["evictor_parameters"],
        "seed": int(cfg.seed),
        "software": software_versions(),
        "draw": int(cfg.draw),
        "n_per_task": int(cfg.n),
        "task_options": params["task_options"],
        "parameters": params,
    }


def collect_input(model, tokenizer, task_input: T.TaskInput, *, cfg: CollectConfig, run_id: str, model_name: str) -> dict:
    """Rows of one input: ``{"inputs": [row], "outcomes": [...], "topk": [...]}``."""
    question_ids = None
    if cfg.mode == "query-agnostic":  # prefill and evict the context; the question comes after
        ids, n_context = T.split_prompt(tokenizer, task_input)
        question_ids = torch.tensor([ids[n_context:]], dtype=torch.long)
    else:
        ids = T.tokenize_prompt(tokenizer, task_input.prompt)
        n_context = len(ids)
    if len(ids) != task_input.n_tokens:
        raise RuntimeError(f"{task_input.task}/{task_input.input_id}: tokenised prompt has {len(ids)} tokens, "
                           f"make_input counted {task_input.n_tokens}")
    input_ids = torch.tensor([ids[:n_context]], dtype=torch.long)
    pre = capture.prefill(model, input_ids, window=cfg.window, snapkv_window=cfg.snapkv_window,
                          **E.capture_options(cfg.parsed_evictors))
    gate = signals.gate_signals(pre.window_attention, k=cfg.k, k_max=max(cfg.k_max, cfg.k),
                                bin_fraction=cfg.bin_fraction, convention=cfg.convention)
    full, arms = sweep.run_sweep(model, tokenizer, pre, evictors=cfg.parsed_evictors, budgets=cfg.budgets,
                                 max_new_tokens=task_input.max_new_tokens, n_sink=cfg.n_sink,
                                 n_recent=cfg.n_recent, batch_arms=cfg.batch_arms, max_batch=cfg.max_batch,
                                 pool_kernel=cfg.pool_kernel, question_ids=question_ids,
                                 budget_floor=cfg.budget_floor)
    refs = task_input.references
    full_score = T.score(task_input.task, full.text, refs)
    key = {"run_id": run_id, "task": task_input.task, "input_id": int(task_input.input_id)}
    outcomes = []
    for arm in arms:
        arm_score = T.score(task_input.task, arm.text, refs)
        if arm.budget == 1.0 and (arm.text != full.text or arm_score != full_score):
            raise AuditError(f"{task_input.task}/{task_input.input_id}: {arm.evictor} at budget 1.0 gave "
                             f"{arm.text!r}, the full-KV arm {full.text!r}")
        outcomes.append({**key, "evictor": arm.evictor, "budget": float(arm.budget), "n_kept": int(arm.n_kept),
                         "prediction": arm.text, "score": float(arm_score), "decode_ms": float(arm.decode_ms),
                         "n_generated": arm.n_generated, "stop_reason": arm.stop_reason})
    inputs_row = {
        "run_id": run_id, "model": model_name, "context_length": int(cfg.context_length), "task": task_input.task,
        "input_id": int(task_input.input_id), "draw": int(task_input.draw), "n_tokens": int(task_input.n_tokens),
        "drop": float(gate.drop), "agreement": [float(x) for x in gate.agreement],
        "pair_jaccard": [float(x) for x in gate.pair_jaccard],
        "signals": {k: float(v) for k, v in gate.signals.items()},
        "prompt": task_input.prompt, "references": list(refs), "full_prediction": full.text,
        "full_score": float(full_score), "full_n_generated": full.n_generated, "full_stop_reason": full.stop_reason,
        "prefill_ms": float(pre.prefill_ms), "gate_ms": float(gate.gate_ms),
    }
    topk = []
    if cfg.k_max:
        idx = gate.topk[:, :, : cfg.k_max]
        n_layers, n_heads = idx.shape[:2]
        topk = [{**key, "layer": layer, "head": head, "indices": idx[layer, head].tolist()}
                for layer in range(n_layers) for head in range(n_heads)]
    return {"inputs": [inputs_row], "outcomes": outcomes, "topk": topk}


@dataclass
class RunSummary:
    out: str
    run_id: str
    shard: tuple[int, int]
    n_shard_inputs: int
    skipped: int
    written: int
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def positions_needed(cfg: CollectConfig) -> int:
    """Most positions an input of the run feeds the model: the context length plus the most tokens
    any of its tasks generates."""
    return int(cfg.context_length) + max(cfg.tokens_to_generate(t) for t in cfg.tasks)


def run_collection(cfg: CollectConfig, *, loaded=None, on_progress=None) -> RunSummary:
    """Collect this shard's unfinished inputs into ``cfg.out``.

    ``loaded`` = ``(model, tokenizer, model_info)`` reuses a loaded model; otherwise
    :func:`collectors.model.load_model` loads ``cfg.model``. ``on_progress(done, total)``, when
    given, is called once the shard knows which of its ``total`` inputs are already finished, and
    after each input it finishes (``done`` counts the shard's finished inputs).
    """
    start = time.perf_counter()
    # Input files first: a missing --qa-file stops the run before any weights are read.
    files = {t: qa_file_for(t, cfg.qa_files) for t in cfg.tasks}
    if loaded is None:
        with hf_progress(cfg.progress):
            loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, attn_impl=cfg.attn_impl,
                                name=cfg.model_name, positions=positions_needed(cfg))
    else:
        check_positions(loaded[0].config, positions_needed(cfg))
        check_windows(loaded[0].config, positions_needed(cfg))
    model, tokenizer, model_info = loaded
    manifest = build_manifest(cfg, model_info)
    writer = RunWriter(cfg.out, manifest, shard=cfg.shard, part_size=cfg.part_size, topk=cfg.k_max > 0)
    done = writer.open()
    mine = shard_items(work_items(cfg.tasks, cfg.n), cfg.shard)
    todo = [it for it in mine if (it.task, it.input_id) not in done]
    written = 0
    if on_progress is not None:
        on_progress(len(mine) - len(todo), len(mine))
    bar = tqdm(todo, total=len(todo), unit="input", disable=not cfg.progress, dynamic_ncols=True,
               desc=f"shard {cfg.shard[0]}/{cfg.shard[1]}")
    try:
        for item in bar:
            bar.set_postfix_str(f"{item.task}#{item.input_id}", refresh=False)
            task_input = T.make_input(
                item.task, tokenizer=tokenizer, context_length=cfg.context_length, input_id=item.input_id,
                draw=cfg.draw, prompt_style=cfg.prompt_style, max_new_tokens=cfg.tokens_to_generate(item.task),
                haystack_file=cfg.haystack_file, qa_file=files[item.task],
                allow_cut_answers=cfg.allow_cut_answers,
            )
            with torch.no_grad():
                rows = collect_input(model, tokenizer, task_input, cfg=cfg, run_id=manifest["run_id"],
                                     model_name=model_info["name"])
            writer.add(rows)
            written += 1
            if on_progress is not None:
                on_progress(len(mine) - len(todo) + written, len(mine))
    finally:
        bar.close()
        writer.close()
    return RunSummary(str(cfg.out), manifest["run_id"], tuple(cfg.shard), len(mine), len(mine) - len(todo),
                      written, writer.removed, time.perf_counter() - start)
