"""Run the shards of one collection as Ray tasks: ``pagestats-collect … --ray [ADDRESS] --shards N``.

Each shard ``i/N`` (the same deterministic split as ``--shard i/N``, :func:`collectors.writer.shard_items`)
is one Ray task that loads the model and runs :func:`collectors.run.run_collection` into the shared
``--out`` directory, holding ``--gpus-per-shard`` GPUs (Ray sets ``CUDA_VISIBLE_DEVICES``, so
``--device cuda`` is the task's own GPU). The driver

* retries a shard whose worker or node went away (a crash, a preempted node, Ray's out-of-memory
  killer: :data:`RETRYABLE`) up to ``max_retries`` times. The writer is atomic and resumable, so a
  retry skips the inputs the lost attempt finished and writes each input exactly once;
* stops every shard and reports the first error when a shard's own code fails (a bad model path,
  a failed audit): the same error on every retry, so it is not retried;
* shows one progress bar over all shards, fed by a small actor that each shard reports to;
* validates the finished run (:func:`pagestats.io.validate_paths`, every input present) and returns
  a :class:`LaunchSummary`.

Ray is an optional dependency (``pip install 'pagestats[ray]'``), imported only here. The output
directory must be on a filesystem every node sees, and every node needs this package installed.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from collectors.hf import disable_progress_bars
from collectors.writer import work_items

if TYPE_CHECKING:
    from collectors.run import CollectConfig


class LaunchError(RuntimeError):
    """A launch did not end with a complete, valid run."""


class ShardFailedError(LaunchError):
    """A shard failed in its own code, or kept losing its worker after every retry."""


@dataclass
class LaunchSummary:
    """What a launch did: the run's inputs, how many this launch collected, retries, wall time."""

    out: str
    run_id: str
    shards: int
    inputs: int
    collected: int
    failures_retried: int
    wall_s: float
    retried: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """The one-line summary printed at the end of a launch."""
        return (f"{self.out}: {self.inputs} inputs valid ({self.collected} collected now, "
                f"{self.inputs - self.collected} there before) by {self.shards} Ray shards; "
                f"{self.failures_retried} failure{'' if self.failures_retried == 1 else 's'} retried; "
                f"wall {self.wall_s:.1f} s")


def retryable_errors() -> tuple[type, ...]:
    """Ray errors meaning the shard's worker or node went away, not that the shard's code failed."""
    import ray.exceptions as rex

    return (rex.WorkerCrashedError, rex.NodeDiedError, rex.OutOfMemoryError, rex.ObjectLostError)


class _Progress:
    """Ray actor holding each shard's count of finished inputs (the latest report of its latest attempt)."""

    def __init__(self):
        self.done: dict[int, int] = {}

    def report(self, shard: int, done: int) -> None:
        self.done[shard] = done

    def total(self) -> int:
        return sum(self.done.values())


def _run_shard(cfg: CollectConfig, index: int, shards: int, progress) -> dict:
    """Body of one shard's Ray task (transformers' own loading bars are off: the driver shows one bar).

    The collection loop (and torch) is imported here, not with the module: the progress actor's
    worker process imports this module to build :class:`_Progress` and needs neither (torch's
    import is ~3.7 s of CPU, in each launch's actor)."""
    from collectors.run import run_collection

    disable_progress_bars()

    shard_cfg = dataclasses.replace(cfg, shard=(index, shards), progress=False)
    summary = run_collection(shard_cfg, on_progress=lambda done, total: progress.report.remote(index, done))
    return summary.to_dict()


def _absolute(cfg: CollectConfig) -> CollectConfig:
    """``cfg`` with its local paths made absolute (Ray workers do not share the driver's directory)."""

    def fix(path):
        if path is None:
            return None
        p = pathlib.Path(path).expanduser()
        return str(p.resolve()) if p.exists() else path

    return dataclasses.replace(cfg, out=str(pathlib.Path(cfg.out).expanduser().resolve()), model=fix(cfg.model),
                               haystack_file=fix(cfg.haystack_file), qa_files=tuple(fix(f) for f in cfg.qa_files))


def _inputs_present(out: pathlib.Path) -> int:
    """Finished inputs in a run directory (rows of its ``inputs`` parts; 0 when there are none)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in (out / "inputs").glob("part-*.parquet"))


def _cancel(ray, pending) -> None:
    """Stop the shards still running (what they finished stays; a rerun resumes from it)."""
    for ref in pending:
        ray.cancel(ref, force=True)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def launch(cfg: CollectConfig, *, shards: int, address: str | None = None, gpus_per_shard: float = 0.0,
           cpus_per_shard: float = 1.0, max_retries: int = 3, progress: bool = True) -> LaunchSummary:
    """Collect ``cfg`` as ``shards`` Ray tasks, retrying lost shards, and validate the run.

    Parameters
    ----------
    cfg : CollectConfig
        The run (its ``shard`` is ignored: each task runs shard ``i/shards``).
    shards : int
        Number of shards (tasks); at most this many run at once, as Ray's resources allow.
    address : str, optional
        Ray cluster address for ``ray.init(address=…)`` (``"auto"``, ``"ray://head:10001"``). None
        starts a local Ray instance. When Ray is already initialised in this process, that
        connection is used and left open.
    gpus_per_shard, cpus_per_shard : float
        Ray resources each task holds.
    max_retries : int
        Most resubmissions of one shard after its worker or node went away.
    progress : bool
        Show the aggregated progress bar.

    Returns
    -------
    LaunchSummary

    Raises
    ------
    ShardFailedError
        A shard's code failed (not retried) or it was lost more than ``max_retries`` times; the
        others are cancelled. Errors of the run's parameters (``ValueError``, ``FileNotFoundError``)
        are re-raised as they are.
    LaunchError
        The finished run does not validate or misses inputs.
    """
    import ray
    from ray.exceptions import RayTaskError
    from tqdm.auto import tqdm

    if shards < 1 or max_retries < 0 or gpus_per_shard < 0 or cpus_per_shard < 0:
        raise ValueError("shards must be ≥ 1, and max_retries, gpus_per_shard and cpus_per_shard ≥ 0")
    start = time.perf_counter()
    cfg = _absolute(cfg)
    out = pathlib.Path(cfg.out)
    before = _inputs_present(out)
    retry_on = retryable_errors()
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address)
        except ConnectionError as err:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise LaunchError(f"cannot start or reach {where}: {_first_line(err)}") from None
    total = len(work_items(cfg.tasks, cfg.n))
    bar = tqdm(total=total, unit="input", desc=f"{shards} shards", disable=not progress, dynamic_ncols=True)
    retried: list[str] = []
    results: dict[int, dict] = {}
    try:
        counter = ray.remote(num_cpus=0)(_Progress).remote()
        task = ray.remote(_run_shard).options(num_gpus=gpus_per_shard, num_cpus=cpus_per_shard, max_retries=0)

        def submit(i):
            return task.remote(cfg, i, shards, counter)

        pending = {submit(i): i for i in range(shards)}
        attempts = dict.fromkeys(range(shards), 0)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            bar.n = min(ray.get(counter.total.remote()), total)
            bar.refresh()
            for ref in ready:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except retry_on as err:
                    if attempts[i] >= max_retries:
                        _cancel(ray, pending)
                        raise ShardFailedError(f"shard {i}/{shards} was lost {attempts[i] + 1} times "
                                               f"(last: {type(err).__name__}); giving up") from None
                    attempts[i] += 1
                    retried.append(f"shard {i}/{shards}: {type(err).__name__}")
                    bar.write(f"shard {i}/{shards} lost its worker ({type(err).__name__}); "
                              f"retry {attempts[i]} of {max_retries}", file=sys.stderr)
                    pending[submit(i)] = i
                except RayTaskError as err:
                    _cancel(ray, pending)
                    cause = err.cause if isinstance(err.cause, BaseException) else err
                    if isinstance(cause, (ValueError, FileNotFoundError)):
                        raise cause from None
                    raise ShardFailedError(f"shard {i}/{shards} failed: {type(cause).__name__}: "
                                           f"{_first_line(cause)}") from None
        bar.n = min(ray.get(counter.total.remote()), total)
        bar.refresh()
    finally:
        bar.close()
        if started:
            ray.shutdown()

    from pagestats.io import validate_paths  # polars and DuckDB: not in a Ray worker's (GPU) image

    problems = validate_paths([cfg.out])
    if problems:
        raise LaunchError(f"the run in {cfg.out} does not validate: {problems[0]} "
                           f"({len(problems)} problem(s); run pagestats validate {cfg.out})")
    present = _inputs_present(out)
    if present != total:
        raise LaunchError(f"the run in {cfg.out} holds {present} of its {total} inputs after every shard finished")
    return LaunchSummary(
        out=cfg.out, run_id=results[0]["run_id"], shards=shards, inputs=total,
        collected=total - before, failures_retried=len(retried),
        wall_s=time.perf_counter() - start, retried=retried,
    )
