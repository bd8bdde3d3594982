"""Validation records: logs that passed every rule are not checked again while their bytes stay the same.

When every rule of :mod:`pagestats.io.validation` passes over a set of log files, :func:`store`
writes a small JSON record into the cache directory (:func:`cache_dir`:
``$PAGESTATS_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagestats``, else ``~/.cache/pagestats``),
under ``validated/``, named by the digest of the files' real paths. It is written atomically
(a temporary file in the same folder, renamed over the old record). A record holds:

* for every file: its sha256 (the rules checked it against the run manifest's ``files[]``), its
  table and rows, and what identifies its bytes on disk, as git's index does: size,
  ``mtime_ns``, ``ctime_ns``, inode and device (rewriting a file changes its ``ctime``, and
  replacing it changes its inode, even when the modification time is put back);
* the digest of every manifest as it was read (its parsed content);
* :func:`validator_digest`: the sha256 of the validator's own source files
  (:data:`VALIDATOR_SOURCES`) and of the versions of the libraries that run the rules, so
  that a changed rule set makes every old record stale;
* when the rules started, and the task classes of the inputs (what a reader needs besides
  the files).

:func:`lookup` accepts a record only when the same files (by real path) are read, each with
the same identity, the manifests are the same and the validator is the same; a file whose
modification time is within :data:`RACY_NS` before the validation started (or after it) could
have changed within the file system's timestamp granularity without its identity changing
(git's "racily clean" entries), so it is hashed again and compared with the recorded sha256.
Any difference means the rules run again. A record that cannot be read or parsed is ignored
with a one-line note, and the rules run again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pagestats.core import schema
from importlib.metadata import version

#: Version of the record's JSON layout.
RECORD_FORMAT = 1
#: A file modified within this many nanoseconds of the validation's start is hashed again on
#: lookup (2 s: the coarsest modification-time granularity of common file systems, FAT's).
RACY_NS = 2_000_000_000
#: The validator's sources, relative to the ``pagestats`` package: every module the rules run in.
VALIDATOR_SOURCES = ("io/*.py", "io/validation/*.py", "core/*.py", "__init__.py")
#: The libraries whose behaviour the rules depend on (their versions enter the digest).
VALIDATOR_LIBRARIES = ("duckdb", "polars", "pyarrow", "numpy")
_IDENTITY = ("size", "mtime_ns", "ctime_ns", "inode", "device")


def cache_dir() -> Path:
    """The user cache directory of pagestats: ``$PAGESTATS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pagestats`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says),
    else ``~/.cache/pagestats``."""
    own = os.environ.get("PAGESTATS_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "pagestats"


@functools.cache
def validator_digest() -> str:
    """sha256 of the validator's source files (:data:`VALIDATOR_SOURCES`, in path order) and of
    the versions of :data:`VALIDATOR_LIBRARIES`."""

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for lib in VALIDATOR_LIBRARIES:
        h.update(f"{lib}=={version(lib)}\n".encode())
    for path in sorted({p for pattern in VALIDATOR_SOURCES for p in root.glob(pattern)}):
        h.update(f"{path.relative_to(root).as_posix()}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _identity(path: str) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
            "device": st.st_dev}


def manifest_digest(manifest) -> str | None:
    """sha256 of a manifest's parsed content (``None`` when it could not be read)."""
    if manifest is None:
        return None
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()


def record_path(files) -> Path:
    """Where the record of the log files ``files`` (real paths) lies."""
    key = hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()
    return cache_dir() / "validated" / f"{key}.json"


@dataclass(frozen=True)
class Snapshot:
    """What identifies the files before the rules run: their identities, the manifests, the time."""

    files: dict  # real path → identity
    manifests: dict  # manifest path → digest
    started_ns: int


def snapshot(files, manifests: dict) -> Snapshot | None:
    """The identities of ``files`` (real paths) and the ``manifests`` digests, taken before the
    rules run (``None`` when a file cannot be stat'ed: the rules report it, no record is made)."""
    started = time.time_ns()
    try:
        return Snapshot({f: _identity(f) for f in files}, dict(manifests), started)
    except OSError:
        return None


@dataclass(frozen=True)
class Record:
    """A record that matched: when the rules passed, and what they saw of each file."""

    path: Path
    validated_at: str
    files: dict  # real path → {"table", "sha256", "rows", identity…}
    task_classes: list  # [run_id, task, task_class]


def _checked(data) -> dict:
    """``data`` if it has the record's layout, else ``ValueError``."""
    def need(ok, what):
        if not ok:
            raise ValueError(what)

    need(isinstance(data, dict), "not a JSON object")
    need(data.get("format") == RECORD_FORMAT, f"format is not {RECORD_FORMAT}")
    for key, kind in (("validator", str), ("validated_at", str), ("started_ns", int), ("manifests", dict),
                      ("files", dict), ("task_classes", list)):
        need(isinstance(data.get(key), kind) and not isinstance(data.get(key), bool), f"{key} is missing or mistyped")
    for entry in data["files"].values():
        need(isinstance(entry, dict), "a file entry is not an object")
        need(isinstance(entry.get("table"), str) and isinstance(entry.get("sha256"), str), "a file entry is mistyped")
        need(all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("rows", *_IDENTITY)),
             "a file entry is mistyped")
    need(all(isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) for x in row)
             for row in data["task_classes"]), "task_classes is mistyped")
    return data


def lookup(files, manifests: dict) -> tuple[Record | None, str | None]:
    """The record of ``files`` (real paths) when it still holds, and a note for a record that
    could not be read (``None`` when there is none to give).

    The record holds when it names the same files with the same identities, the same manifest
    digests (``manifests``: path → :func:`manifest_digest`) and the same
    :func:`validator_digest`; a racily clean file (see the module docstring) must also hash to
    its recorded sha256.
    """
    path = record_path(files)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as err:
        return None, f"note: cannot read the validation record {path} ({_reason(err)}); checking every rule again"
    try:
        data = _checked(json.loads(text))
    except ValueError as err:
        return None, f"note: ignored the corrupt validation record {path} ({_reason(err)}); checking every rule again"
    if (data["validator"] != validator_digest() or sorted(data["files"]) != sorted(files)
            or data["manifests"] != dict(manifests)):
        return None, None
    for name, entry in data["files"].items():
        try:
            now = _identity(name)
        except OSError:
            return None, None
        if any(now[k] != entry[k] for k in _IDENTITY):
            return None, None
        if now["mtime_ns"] >= data["started_ns"] - RACY_NS:  # racily clean: look at the bytes
            try:
                if schema.sha256_file(name) != entry["sha256"]:
                    return None, None
            except OSError:
                return None, None
    return Record(path, data["validated_at"], data["files"], data["task_classes"]), None


def store(snap: Snapshot, files: dict, task_classes: list) -> str | None:
    """Write the record of logs that passed every rule; a note when it could not be written.

    Parameters
    ----------
    snap : Snapshot
        Taken before the rules ran; when a file's identity changed since, no record is written
        (the rules may have read the old or the new bytes).
    files : dict
        Real path → ``{"table", "sha256", "rows"}``, for every file of ``snap``.
    task_classes : list
        ``[run_id, task, task_class]`` rows.
    """
    try:
        after = {f: _identity(f) for f in snap.files}
    except OSError:
        after = None
    if after != snap.files:
        return "note: a log file changed while it was checked; no validation record written"
    data = {
        "format": RECORD_FORMAT,
        "validator": validator_digest(),
        "validated_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap.started_ns / 1e9)),
        "started_ns": snap.started_ns,
        "manifests": snap.manifests,
        "files": {f: {**files[f], **snap.files[f]} for f in sorted(snap.files)},
        "task_classes": task_classes,
    }
    path = record_path(snap.files)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as err:
        return f"note: cannot write the validation record {path} ({_reason(err)}); the next call checks every rule again"
    return None


def unchanged_line(validated_at: list[str], groups: int) -> str | None:
    """The stderr line saying that the rules were skipped for ``len(validated_at)`` of ``groups``
    runs (or file sets) whose records held, validated at those times (``None`` when none was)."""
    if not validated_at:
        return None
    since = min(validated_at)
    what = "logs" if len(validated_at) == groups else f"{len(validated_at)} of {groups} runs"
    rest = "" if len(validated_at) == groups else ", the others checked now"
    return f"{what} unchanged since validated at {since}{rest}; `--revalidate` to check again"


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return (text or type(err).__name__)[:200]
