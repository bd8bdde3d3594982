"""The loader guard: what the reader agrees to open, and how much of it it reads (docs/SCHEMA.md).

Every file the reader opens passes :func:`check_regular` first: it must be a regular file
(not a FIFO, a device, a socket or a directory) and, when it belongs to a run, its real
location (symbolic links resolved) must lie inside the run directory. ``manifest.json``
is then read by :func:`read_manifest`, which bounds what it accepts: at most
:data:`MAX_MANIFEST_BYTES` bytes, JSON nesting at most :data:`MAX_JSON_DEPTH` deep,
integers within int64, numbers finite (no ``NaN`` / ``Infinity``). Directory listings go
through :func:`list_dir`. Each refusal, and every ``OSError`` on the way, is raised as a
:class:`Refused` whose message is one line.
"""

from __future__ import annotations

import json
import math
import os
import stat

#: Largest ``manifest.json`` read (bytes); a collector writes a few kB.
MAX_MANIFEST_BYTES = 16 * 2**20
#: Deepest nesting of JSON arrays / objects accepted in a manifest.
MAX_JSON_DEPTH = 64
#: Integers of a manifest must fit in a signed 64-bit integer, like the log columns.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Refused(Exception):
    """A path the reader does not open or read; ``str(err)`` is the one-line reason."""


def os_reason(err: OSError) -> str:
    """One line for an ``OSError`` (its strerror, without the path the caller names anyway)."""
    return err.strerror or type(err).__name__


def inside(path: str, root: str) -> bool:
    """Whether ``path``'s real location (symbolic links resolved) lies inside directory ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return os.path.commonpath([real_root, real]) == real_root


def check_regular(path: str, root: str | None = None) -> None:
    """Raise :class:`Refused` unless ``path`` is a regular file (inside ``root`` when given)."""
    if root is not None and not inside(path, root):
        raise Refused(f"resolves outside its run directory {root} (symbolic link?)")
    try:
        st = os.stat(path)
    except OSError as err:
        raise Refused(f"cannot read: {os_reason(err)}") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise Refused(f"is {kind}, not a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise Refused("is not a regular file")


def list_dir(path: str) -> list[os.DirEntry]:
    """The entries of directory ``path``, sorted by name; :class:`Refused` on any ``OSError``."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as err:
        raise Refused(f"cannot list the directory: {os_reason(err)}") from None


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise Refused(f"integer {text[:24]}{'…' if len(text) > 24 else ''} is outside the int64 range")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise Refused(f"integer {text} is outside the int64 range")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"number {text[:24]} is not finite")
    return value


def _parse_constant(text: str):
    raise Refused(f"{text} is not a JSON number")


def _depth_ok(text: str) -> bool:
    """Whether JSON ``text`` nests arrays/objects at most :data:`MAX_JSON_DEPTH` deep
    (brackets inside strings are not counted)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return True
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def read_manifest(path: str, root: str) -> object:
    """Parse the ``manifest.json`` at ``path`` of the run directory ``root``, within the bounds
    of the module docstring; :class:`Refused` with the reason otherwise."""
    check_regular(path, root)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as err:
        raise Refused(f"cannot read: {os_reason(err)}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise Refused(f"manifest is larger than {MAX_MANIFEST_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(f"manifest is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not _depth_ok(text):
        raise Refused(f"manifest nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except Refused as err:
        raise Refused(f"cannot read manifest: {err}") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise Refused(f"cannot read manifest: {line[:200]}") from None
