"""Pre-registration of prediction files by sha256 (§4 "Pre-Registered 32K Test", Table 21).

The bands themselves come from
:func:`pagestats.metrics.scaling.predict_band`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = ["PreregistrationError", "freeze_predictions", "load_predictions"]


class PreregistrationError(ValueError):
    """A frozen prediction file does not match its recorded sha256."""


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FORMATS = (".csv", ".parquet")


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"prediction file must end in .csv or .parquet, got {path.name!r}")
    return suffix


def freeze_predictions(frame, path, *, overwrite: bool = False) -> str:
    """Freeze a pre-registered prediction table (Table 21; §4 "Pre-Registered 32K Test").

    Writes ``frame`` (a polars DataFrame) to ``path`` (``.csv`` or ``.parquet``)
    atomically, then records its sha256 in ``path + ".sha256"`` (``sha256sum`` format,
    ``"<hex>  <name>"``) and returns it. The hash is of the file's bytes, so it is what
    :func:`load_predictions` checks. An existing file is never replaced unless
    ``overwrite=True`` — a pre-registration that can be silently redone is not one.
    Record the returned hash somewhere the measurement cannot touch (a commit, a report)
    before the measurement is run.
    """
    path = Path(path)
    fmt = _format(path)
    if not hasattr(frame, "write_csv"):
        raise TypeError("frame must be a polars DataFrame")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; predictions are frozen once (overwrite=True to replace)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    if fmt == ".csv":
        frame.write_csv(tmp)
    else:
        frame.write_parquet(tmp)
    os.replace(tmp, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return digest


def load_predictions(path, sha256: str):
    """Load a frozen prediction table after checking its sha256 (Table 21).

    The file is read once; its bytes are hashed and compared with ``sha256`` *before*
    they are parsed, so a mismatching file is never used. Call this before any
    measurement of the predicted quantity is loaded.

    Raises
    ------
    PreregistrationError
        The file's sha256 differs from ``sha256``.
    """
    import io

    import polars as pl

    path = Path(path)
    fmt = _format(path)
    expected = str(sha256).strip().lower()
    if not _HEX64.match(expected):
        raise ValueError("sha256 must be 64 hexadecimal characters")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise PreregistrationError(f"{path}: sha256 {actual} does not match the frozen {expected}")
    return pl.read_csv(io.BytesIO(data)) if fmt == ".csv" else pl.read_parquet(io.BytesIO(data))
