"""A two-step pre-registration of the scaling prediction (§4 "Pre-Registered 32K Test", Table 21).

Step 1, ``pagestats prereg freeze``: the prediction band (:func:`pagestats.tables.prediction_band`:
the ratio ρ/(1 − A_full) of the fitting contexts × the target context's full-KV headroom) is
written once to a JSON file with the time it was frozen, and its sha256 is printed, to be
recorded somewhere the measurement cannot touch. Step 2, ``pagestats prereg check``: the band is
read back only if its bytes still hash to the recorded sha256, and only if it was frozen
before every run whose eviction outcomes it is checked against was created (the run
manifests' ``created_at``). A band that can be redone, edited or written after the fact is
not a pre-registration, so each of these is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from pagestats.core import formulas
from pagestats.core.schema import utc_time
from pagestats.io.logs import Logs

__all__ = [
    "BAND_KIND", "PreregistrationError", "check_frozen_before", "freeze_band", "is_sha256", "load_band", "target_runs", "verified_band",
]

#: The ``kind`` field of a band file.
BAND_KIND = "pagestats prediction band"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(text: str) -> bool:
    """Whether ``text`` is a SHA-256 in hexadecimal (64 digits; case and surrounding blanks ignored)."""
    return bool(_HEX64.match(str(text).strip().lower()))


class PreregistrationError(ValueError):
    """A band that cannot count as pre-registered: wrong hash, edited, or frozen too late."""


def freeze_band(band, meta: dict, path, *, now: datetime | None = None) -> str:
    """Write the prediction band to ``path`` (JSON) once and return the sha256 of its bytes.

    Parameters
    ----------
    band : polars.DataFrame
        One row per predicted group (:func:`pagestats.tables.prediction_band`).
    meta : dict
        What the band was computed from (fitting and target contexts, evictor, runs, files).
    path : str or path
        The band file; an existing file is never replaced.
    now : datetime, optional
        The freezing time recorded as ``frozen_at`` (default: the current UTC time).

    Raises
    ------
    FileExistsError
        ``path`` exists.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; a band is frozen once (choose a new path)")
    frozen_at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds")
    doc = {"kind": BAND_KIND, "frozen_at": frozen_at, **meta, "band": band.to_dicts()}
    data = (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    try:
        os.link(tmp, path)  # atomic and refuses an existing path, unlike os.replace
    finally:
        tmp.unlink()
    return hashlib.sha256(data).hexdigest()


def load_band(path, sha256: str):
    """Read a frozen band after checking its sha256; return ``(meta, band)``.

    The bytes are hashed before they are parsed, so a file that differs from the recorded
    hash is never used.

    Raises
    ------
    PreregistrationError
        The hash differs, or the file is not a band.
    """
    if not is_sha256(sha256):
        raise PreregistrationError(f"the recorded sha256 must be 64 hexadecimal characters, got {sha256!r}")
    expected = str(sha256).strip().lower()
    data = Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise PreregistrationError(f"{path}: sha256 {actual} does not match the recorded {expected}; "
                                   "the band was changed after it was frozen")
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("kind") != BAND_KIND or "band" not in doc or "frozen_at" not in doc:
        raise PreregistrationError(f"{path}: not a {BAND_KIND} file")
    rows = doc.pop("band")
    return doc, pl.DataFrame(rows)


def check_frozen_before(meta: dict, manifests: dict, run_ids) -> None:
    """Refuse a band frozen at or after the creation of any run whose outcomes it is checked on.

    Parameters
    ----------
    meta : dict
        The band's metadata (``frozen_at``).
    manifests : dict
        run_id → manifest (``created_at``).
    run_ids : iterable of str
        The runs that supply the target context's eviction outcomes.

    Raises
    ------
    PreregistrationError
        A run was created no later than the band was frozen, or has no ``created_at``.
    """
    try:
        frozen = utc_time(meta["frozen_at"])
    except ValueError as err:
        raise PreregistrationError(f"the band's frozen_at {meta['frozen_at']!r} is not an ISO 8601 time stamp") from err
    for run_id in sorted(run_ids):
        created = (manifests.get(run_id) or {}).get("created_at")
        if created is None:
            raise PreregistrationError(f"run {run_id} has no created_at; cannot show the band was frozen before it")
        if utc_time(created) <= frozen:
            raise PreregistrationError(f"the band was frozen at {meta['frozen_at']}, after run {run_id} "
                                       f"(created {created}) whose outcomes it would be checked on")


def target_runs(logs: Logs, context_length: int, evictor: str) -> list[str]:
    """The runs that hold eviction outcomes (b < 1) of ``evictor`` at ``context_length``: the
    measurement a band at that context is checked on."""
    runs = logs.inputs.filter(pl.col("context_length") == int(context_length)).select("run_id").unique()
    rows = logs.outcomes.filter((pl.col("evictor") == evictor) & formulas.EVICTED).join(runs, on="run_id")
    return sorted(rows["run_id"].unique().to_list())


def verified_band(logs: Logs, path, sha256: str):
    """:func:`load_band`, then :func:`check_frozen_before` against the runs of :func:`target_runs`;
    return ``(meta, band)``. Raises :class:`PreregistrationError` on any failed check."""
    meta, band = load_band(path, sha256)
    runs = target_runs(logs, meta["target_context"], meta["evictor"])
    if not runs:
        raise PreregistrationError(f"no {meta['evictor']} eviction outcomes at {meta['target_context']} tokens "
                                   "in the logs to check the band against")
    check_frozen_before(meta, logs.manifests, runs)
    return meta, band
