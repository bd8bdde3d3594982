"""Schema-version upgrades applied on read (docs/SCHEMA.md).

:data:`UPGRADES` maps ``from_version`` to one :class:`Upgrade` step ``v`` → ``v + 1``;
``upgrade_manifest``, ``upgrade_schema`` and ``upgrade_table`` apply the steps from a run's
version to :data:`pagestats.core.schema.SCHEMA_VERSION`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from pagestats.core import schema


def _same_manifest(manifest: dict) -> dict:
    return manifest


def _same_schema(table: str, arrow_schema: pa.Schema) -> pa.Schema:
    return arrow_schema


def _same_table(table: str, frame: pl.DataFrame) -> pl.DataFrame:
    return frame


@dataclass(frozen=True)
class Upgrade:
    """One schema step ``v`` → ``v + 1``, applied on read to the manifest, to each file's
    arrow schema before the type check, and to each table once read (canonical types)."""

    manifest: Callable[[dict], dict] = _same_manifest
    schema: Callable[[str, pa.Schema], pa.Schema] = _same_schema
    table: Callable[[str, pl.DataFrame], pl.DataFrame] = _same_table


#: Columns v2 added, per table: (name, arrow type, the value an upgraded v1 row gets).
V2_COLUMNS = {
    "inputs": (("full_n_generated", pa.int64(), None), ("full_stop_reason", pa.string(), schema.STOP_UNKNOWN)),
    "outcomes": (("n_generated", pa.int64(), None), ("stop_reason", pa.string(), schema.STOP_UNKNOWN)),
}
_POLARS = {pa.int64(): pl.Int64, pa.string(): pl.String}


def _v2_schema(table: str, arrow_schema: pa.Schema) -> pa.Schema:
    for name, arrow_type, _ in V2_COLUMNS.get(table, ()):
        if name not in arrow_schema.names:
            arrow_schema = arrow_schema.append(pa.field(name, arrow_type))
    return arrow_schema


def _v2_table(table: str, frame: pl.DataFrame) -> pl.DataFrame:
    """v1 → v2: a v1 log did not record why a decode stopped, so the reason is ``unknown`` and the
    count null; readers then fall back to the text-based check (:mod:`pagestats.io.truncation`)."""
    add = [pl.lit(value, dtype=_POLARS[arrow_type]).alias(name)
           for name, arrow_type, value in V2_COLUMNS.get(table, ()) if name not in frame.columns]
    if not add:
        return frame
    frame = frame.with_columns(add)
    order = [c.name for c in schema.TABLES[table] if c.name in frame.columns]  # a v2 file's column order
    return frame.select(*order, *[c for c in frame.columns if c not in order])


#: from_version → Upgrade (v1 → v2: the stop reason and token count of every decode, unknown in v1).
UPGRADES: dict[int, Upgrade] = {1: Upgrade(schema=_v2_schema, table=_v2_table)}


def upgrade_manifest(manifest: dict) -> dict:
    """Apply the :data:`UPGRADES` steps from the manifest's version to the current one."""
    version = manifest.get("schema_version")
    while isinstance(version, int) and version < schema.SCHEMA_VERSION and version in UPGRADES:
        manifest = UPGRADES[version].manifest(dict(manifest))
        version += 1
        manifest["schema_version"] = version
    return manifest


def upgrade_schema(table: str, arrow_schema: pa.Schema, version: int) -> pa.Schema:
    """A file's arrow schema as the current version declares it (for the type check)."""
    while version < schema.SCHEMA_VERSION:
        arrow_schema = UPGRADES[version].schema(table, arrow_schema)
        version += 1
    return arrow_schema


def upgrade_table(table: str, frame: pl.DataFrame, version: int) -> pl.DataFrame:
    """Apply the :data:`UPGRADES` steps to one table read at schema ``version``."""
    while version < schema.SCHEMA_VERSION:
        frame = UPGRADES[version].table(table, frame)
        version += 1
    return frame
