"""Sharded, atomic, resumable output of a run in log schema v1 (docs/SCHEMA.md, docs/COLLECTION.md).

Layout of a run directory ``OUT``::

    OUT/manifest.json                      rewritten (atomically, under a lock) after every part
    OUT/inputs/part-SSSS-of-NNNN-QQQQQQ.parquet
    OUT/outcomes/part-SSSS-of-NNNN-QQQQQQ.parquet
    OUT/topk/part-SSSS-of-NNNN-QQQQQQ.parquet     (when top-k indices are stored)

A *part* holds a small batch of finished inputs — their ``inputs`` rows, every ``outcomes`` row and
every ``topk`` row — written by shard ``SSSS`` of ``NNNN`` as its ``QQQQQQ``-th part.

Guarantees
----------
* Atomic files: each file is written to a temp name and renamed (:func:`pagestats.core.schema.write_parquet`).
* Atomic parts: ``topk`` and ``outcomes`` are written first and ``inputs`` LAST, so a part counts as
  finished only when its ``inputs`` file exists (together with the others). On start, a shard
  deletes its own temp files and its own incomplete parts; other shards' files are left alone, so
  shards may run concurrently into one directory.
* Resume: the finished ``(task, input_id)`` are read from every shard's ``inputs`` parts and skipped;
  an input is written in exactly one part, so no row is ever duplicated.
* The manifest lists the files of finished parts only, so it never names half a part.
* Same run: the ``run_id`` is a hash of the run's parameters (:func:`run_id_for`); starting in a
  directory whose manifest has another ``run_id`` is refused with the differing parameters named.

Deployment runs (``kind="deployment"``, :mod:`collectors.deploy` with ``log_dir``): the same parts
with ``inputs`` alone, its rows declared by :data:`pagestats.core.schema.DEPLOYMENT`, an input named by its
``input_id`` only; the manifest records ``kind``.

Deterministic work split (``--shard i/n``): the inputs are numbered
``global_index = input_id · len(tasks) + task_index`` (input-major, so raising ``--n`` keeps every
earlier index) and shard ``i`` takes those with ``global_index % n == i`` (:func:`shard_items`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from pagestats.core import schema

#: Test hook: ``N`` — after N complete parts, the next part's write dies (``os._exit``) after its
#: topk/outcomes files and before its inputs file, as a crash mid-part would. ``N@TOKEN`` — the same,
#: but only in the one process that deletes the file TOKEN first, so it kills exactly one attempt
#: (a retried or concurrent shard finds the token gone and runs on); no crash while TOKEN is absent.
CRASH_ENV = "PAGESTATS_COLLECT_CRASH_AFTER_PARTS"
CRASH_EXIT_CODE = 75
PART_RE = re.compile(r"^part-(\d{4})-of-(\d{4})-(\d{6})\.parquet$")
TABLE_ORDER = ("topk", "outcomes", "inputs")  # inputs last: its presence marks a finished part


class RunMismatchError(ValueError):
    """The output directory holds a different run (other parameters)."""


@dataclass(frozen=True)
class WorkItem:
    index: int
    task: str
    input_id: int


def work_items(tasks, n: int) -> list[WorkItem]:
    """Every input of the run, numbered input-major: ``index = input_id · len(tasks) + task_index``."""
    tasks = list(tasks)
    return [WorkItem(i * len(tasks) + t, task, i) for i in range(int(n)) for t, task in enumerate(tasks)]


def parse_shard(spec: str) -> tuple[int, int]:
    """``"i/n"`` → ``(i, n)`` with ``0 ≤ i < n``."""
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        raise ValueError(f"a shard must look like i/n (e.g. 0/4), got {spec!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"a shard i/n needs 0 ≤ i < n, got {spec!r}")
    return i, n


def shard_items(items, shard: tuple[int, int]) -> list[WorkItem]:
    """Items whose global index ≡ i (mod n): the shards of one n partition the work."""
    i, n = shard
    return [it for it in items if it.index % n == i]


def run_id_for(parameters: dict, *, label: str = "run") -> str:
    """Deterministic run id: a readable label plus the first 16 hex of the sha256 of the
    canonical JSON of ``parameters``."""
    import hashlib

    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True, default=str).encode()).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:48] or "run"
    return f"{slug}-{digest[:16]}"


def _diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: existing {a!r} vs requested {b!r}")
    return out


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class RunWriter:
    """Writer of one shard of a run.

    Parameters
    ----------
    out : path
        Run directory (created).
    manifest : dict
        Every manifest key except ``files``/``schema_version`` (:data:`pagestats.core.schema.MANIFEST_KEYS`),
        including ``run_id`` and a ``parameters`` dict (what the run id hashes).
    shard : (i, n)
    part_size : int
        Inputs per part.
    topk : bool
        Whether ``topk`` rows are written (a part then needs all three files).
    kind : {"collection", "deployment"}
        A deployment run (:data:`pagestats.core.schema.DEPLOYMENT_KIND`) writes ``inputs`` alone, with the
        columns of :data:`pagestats.core.schema.DEPLOYMENT`, and names an input by ``input_id`` alone.
    """

    def __init__(self, out, manifest: dict, *, shard=(0, 1), part_size: int = 8, topk: bool = True,
                 kind: str = schema.COLLECTION_KIND):
        if part_size < 1:
            raise ValueError(f"part_size must be ≥ 1, got {part_size}")
        if kind not in schema.RUN_KINDS:
            raise ValueError(f"kind must be one of {schema.RUN_KINDS}, got {kind!r}")
        for key in ("run_id", "parameters"):
            if key not in manifest:
                raise ValueError(f"manifest needs {key!r}")
        self.out = Path(out)
        self.manifest = dict(manifest)
        self.shard = tuple(shard)
        self.part_size = int(part_size)
        self.kind = kind
        deployment = kind == schema.DEPLOYMENT_KIND
        self.tables = ("inputs",) if deployment else TABLE_ORDER if topk else ("outcomes", "inputs")
        #: the declared table each directory's rows follow, and the columns that name an input
        self.declared = {"inputs": "deployment"} if deployment else {}
        self.key = ("input_id",) if deployment else ("task", "input_id")
        self.prefix = f"part-{self.shard[0]:04d}-of-{self.shard[1]:04d}-"
        self._buffer: dict[str, list[dict]] = {t: [] for t in schema.TABLES}
        self._n_buffered = 0
        self._next_seq = 1
        self._written_parts = 0
        self.done: set[tuple[str, int]] = set()
        self.removed: list[str] = []
        self._hashes: dict[tuple, tuple[str, int]] = {}

    # ------------------------------------------------------------------ start
    def open(self) -> set[tuple[str, int]]:
        """Create the directory, check it holds this run, clean this shard's debris, write the
        manifest; return the finished ``(task, input_id)`` of every shard."""
        self.out.mkdir(parents=True, exist_ok=True)
        with _locked(self.out / ".lock"):
            path = self.out / "manifest.json"
            if path.exists():
                old = json.loads(path.read_text())
                if old.get("run_id") != self.manifest["run_id"]:
                    lines = _diff(old.get("parameters", {}), self.manifest["parameters"]) or [
                        f"run_id {old.get('run_id')!r} vs {self.manifest['run_id']!r}"
                    ]
                    raise RunMismatchError(
                        f"{self.out} holds another run ({old.get('run_id')}); refusing to resume into it "
                        f"with different parameters:\n  " + "\n  ".join(lines)
                        + "\nUse another output directory, or the original parameters to resume."
                    )
                self.manifest["created_at"] = old.get("created_at", self.manifest.get("created_at"))
                if "n_per_task" in old or "n_per_task" in self.manifest:
                    self.manifest["n_per_task"] = max(old.get("n_per_task", 0), self.manifest.get("n_per_task", 0))
            elif any(any((self.out / t).glob("*.parquet")) for t in schema.TABLES):
                raise RunMismatchError(f"{self.out} has parquet parts but no manifest.json; refusing to write into it")
            for stale in self.out.glob("manifest.json.tmp-*"):  # manifest writes hold the lock we hold
                stale.unlink()
            self._clean()
            self.done = self._finished()
            seqs = [int(m.group(3)) for f in (self.out / "inputs").glob(self.prefix + "*.parquet")
                    if (m := PART_RE.match(f.name))]
            self._next_seq = max(seqs, default=0) + 1
            self._write_manifest()
        return set(self.done)

    def _clean(self) -> None:
        for table in schema.TABLES:
            d = self.out / table
            if self.kind == schema.COLLECTION_KIND or table in self.tables:
                d.mkdir(exist_ok=True)
            elif not d.is_dir():  # a deployment run has no outcomes/ or topk/
                continue
            for f in d.glob(self.prefix + "*.parquet.tmp-*"):
                f.unlink()
                self.removed.append(str(f))
        parts: dict[str, set[str]] = {}
        for table in schema.TABLES:
            for f in (self.out / table).glob(self.prefix + "*.parquet"):
                parts.setdefault(f.name, set()).add(table)
        for name, present in parts.items():
            if not set(self.tables) <= present:  # incomplete part (crash before its inputs file)
                for table in present:
                    (self.out / table / name).unlink()
                    self.removed.append(f"{table}/{name}")

    def _finished(self) -> set[tuple]:
        done: set[tuple] = set()
        for f in sorted((self.out / "inputs").glob("part-*.parquet")):
            t = pq.read_table(f, columns=["run_id", *self.key])
            run_ids = set(t.column("run_id").to_pylist())
            if run_ids - {self.manifest["run_id"]}:
                raise RunMismatchError(f"{f} holds rows of run(s) {sorted(run_ids)}, not {self.manifest['run_id']}")
            for values in zip(*(t.column(c).to_pylist() for c in self.key)):
                key = self._key_of(dict(zip(self.key, values)))
                if key in done:
                    raise RunMismatchError(f"{f}: input {key} already present in another part")
                done.add(key)
        return done

    # ------------------------------------------------------------------ rows
    def add(self, rows: dict[str, list[dict]]) -> None:
        """Buffer one finished input (``{"inputs": [row], "outcomes": [...], "topk": [...]}``);
        a part is written every ``part_size`` inputs."""
        if len(rows.get("inputs", [])) != 1:
            raise ValueError("add() takes the rows of exactly one input")
        key = self._key_of(rows["inputs"][0])
        if key in self.done:
            raise ValueError(f"input {key} is already written")
        for table, table_rows in rows.items():
            if table not in self._buffer or (table_rows and table not in self.tables):
                raise ValueError(f"unknown table {table!r}")
            self._buffer[table].extend(table_rows)
        self.done.add(key)
        self._n_buffered += 1
        if self._n_buffered >= self.part_size:
            self.flush()

    def flush(self) -> None:
        """Write the buffered inputs as one part (topk, outcomes, then inputs) and the manifest."""
        if not self._n_buffered:
            return
        name = f"{self.prefix}{self._next_seq:06d}.parquet"
        for table in self.tables:
            if table == "inputs" and _crash_now(self._written_parts):
                os._exit(CRASH_EXIT_CODE)  # test hook: die mid-part
            declared = self.declared.get(table, table)
            schema.write_parquet(declared, _columns(self._buffer[table], declared), self.out / table / name)
        self._buffer = {t: [] for t in schema.TABLES}
        self._n_buffered = 0
        self._next_seq += 1
        self._written_parts += 1
        with _locked(self.out / ".lock"):
            self._write_manifest()

    def _key_of(self, row: dict) -> tuple:
        """The input a row belongs to: ``(task, input_id)``, or ``(input_id,)`` in a deployment run."""
        return tuple(int(row[c]) if c == "input_id" else row[c] for c in self.key)

    def close(self) -> None:
        self.flush()
        with _locked(self.out / ".lock"):
            self._write_manifest()

    def _part_names(self) -> dict[str, set[str]]:
        """Per table, the names of its ``part-*.parquet`` files (one directory listing each)."""
        out = {}
        for table in schema.TABLES:
            folder = os.path.join(self.out, table)
            names = [e.name for e in os.scandir(folder)] if os.path.isdir(folder) else []
            out[table] = {n for n in names if n.startswith("part-") and n.endswith(".parquet")}
        return out

    def _complete_parts(self, present: dict[str, set[str]] | None = None) -> list[str]:
        """Names of the finished parts of every shard (an ``inputs`` file and its companions)."""
        present = self._part_names() if present is None else present
        return sorted(n for n in present["inputs"] if all(n in present[t] for t in self.tables))

    def _write_manifest(self) -> None:
        """``manifest.json`` listing the files of finished parts only (path, sha256, rows), written
        atomically; hashes are cached by (path, size, mtime). Same layout as
        :func:`pagestats.core.schema.write_manifest`, which would also list another shard's half-written part.
        One listing per table directory and one ``stat`` per file: a log of many parts (a deployment run
        of one row per part) is rewritten in time linear in its parts, with a small constant."""
        files = []
        present = self._part_names()
        for name in self._complete_parts(present):
            for table in schema.TABLES:
                if name not in present[table]:
                    continue
                f = os.path.join(self.out, table, name)
                st = os.stat(f)
                key = (f, st.st_size, st.st_mtime_ns)
                if key not in self._hashes:
                    self._hashes[key] = (schema.sha256_file(f), pq.ParquetFile(f).metadata.num_rows)
                sha, rows = self._hashes[key]
                files.append({"path": f"{table}/{name}", "sha256": sha, "rows": rows})
        files.sort(key=lambda x: (list(schema.TABLES).index(x["path"].split("/")[0]), x["path"]))
        body = {"schema_version": schema.SCHEMA_VERSION, **self.manifest, "files": files}
        body["schema_version"] = schema.SCHEMA_VERSION
        path = self.out / "manifest.json"
        tmp = self.out / f"manifest.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
        os.replace(tmp, path)


def _crash_now(written_parts: int) -> bool:
    """Whether the :data:`CRASH_ENV` test hook kills this part's write."""
    spec = os.environ.get(CRASH_ENV)
    if spec is None:
        return False
    after, _, token = spec.partition("@")
    if written_parts < int(after):
        return False
    if not token:
        return True
    try:
        os.unlink(token)  # atomic: exactly one process wins
    except FileNotFoundError:
        return False
    return True


def _columns(rows: list[dict], table: str) -> dict:
    """Row dicts → dict of columns in the declared order of ``table`` (``signals`` kept as structs)."""
    import pyarrow as pa

    names = [c.name for c in schema.columns(table)]
    cols = {}
    for name in names:
        if rows and name in rows[0]:
            cols[name] = [r[name] for r in rows]
        elif not rows:
            cols[name] = pa.array([], type=schema.arrow_schema(table).field(name).type) if name != "signals" else None
    cols = {k: v for k, v in cols.items() if v is not None}
    return cols


def software_versions() -> dict:
    """The versions a manifest records (``software``): Python, torch, transformers, pagestats, kvpress
    (``None`` for a package that is not installed)."""
    import importlib.metadata as md

    def v(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": v("torch"), "transformers": v("transformers"),
            "pagestats": v("pagestats"), "kvpress": v("kvpress")}
