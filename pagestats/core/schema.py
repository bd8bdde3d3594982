"""Log schema v2: the contract between ``collectors`` (writer) and ``pagestats`` (reader).

Declared once here, exactly as docs/SCHEMA.md, and imported by both halves. A *run* is a
directory::

    <run>/manifest.json        run-level metadata (``MANIFEST_KEYS``) and file hashes
    <run>/inputs/*.parquet     one row per input                     (``INPUTS``)
    <run>/outcomes/*.parquet   one row per (input, evictor, budget)  (``OUTCOMES``)
    <run>/topk/*.parquet       optional per (input, layer, head) top-k_max key indices (``TOPK``)

Types (docs/SCHEMA.md): ids, counts and lengths are int64; budgets, drops, scores and timings
float64; text utf-8; ``signals`` a struct of float64 fields (may be absent). Readers accept
any integer width for int columns and float32 for float columns, and reject anything else
(:func:`type_problem`). Input identity is ``(run_id, task, input_id)`` (``INPUT_KEY``).

Notes
-----
``pair_jaccard`` is layer-major: for layer ℓ and the pair (i, j), i < j, in lexicographic
order, the value sits at ``ℓ·P + p`` with ``P = H(H−1)/2`` and ``p`` the pair's rank
(:func:`pagestats.core.profile.pair_index`). ``agreement`` is a_ℓ (§3, Eq. 3 inputs) and ``drop``
is D (Eq. 3) computed from the stored float32 ``agreement`` by
:func:`pagestats.core.profile.drop_from_agreement`, so an offline replay of the logged defaults
reproduces ``drop`` bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 2
#: Versions this reader can load (older ones are upgraded on read, see ``pagestats.io.upgrades``).
READABLE_VERSIONS = (1, 2)

#: Why a decode stopped (``full_stop_reason``, ``stop_reason``): the model's EOS, a stop string the
#: task defines, or the task's decode limit; ``unknown`` only in logs upgraded from v1, which did
#: not record it.
STOP_REASONS = ("eos", "stop", "length")
STOP_UNKNOWN = "unknown"

INPUT_KEY = ("run_id", "task", "input_id")

#: Columns that may be null in an *imported* run (a manifest with an ``imported`` block, written by
#: ``pagestats import``): what released logs of other tools do not record. The PAGE release has no
#: prompts, no pair Jaccards, no timings, no D in its RULER sweeps (plain arm only), per-layer
#: profiles only for some runs, texts only in some files, and no full-KV outcome for the gate-open inputs of a file without b = 1 rows
#: (docs/IMPORT.md). Every other rule applies to imported runs as to collected ones.
IMPORTED_NULLABLE = {
    "inputs": ("drop", "agreement", "pair_jaccard", "prompt", "references", "full_prediction", "full_score",
               "prefill_ms", "gate_ms"),
    "outcomes": ("prediction", "decode_ms"),
}
OUTCOME_KEY = (*INPUT_KEY, "evictor", "budget")
TOPK_KEY = (*INPUT_KEY, "layer", "head")

# Kinds used by the type check: what the writer produces and what the reader accepts.
INT = "int"  # int64 written; any integer width accepted
FLOAT = "float"  # float64 written; float32 accepted
STRING = "string"
FLOAT_LIST = "list<float>"  # list<float32> written; list<float64> accepted
INT_LIST = "list<int>"  # list<int32> written; any integer width accepted
STRING_LIST = "list<string>"
STRUCT = "struct<float>"  # struct of float64 fields
BOOL = "bool"  # boolean (deployment runs' gate_open)


@dataclass(frozen=True)
class Column:
    """One declared column: name, kind, writer's arrow type, and whether it may be absent."""

    name: str
    kind: str
    arrow_type: pa.DataType
    required: bool = True
    doc: str = ""


def _c(name, kind, arrow_type, doc="", required=True):
    return Column(name, kind, arrow_type, required, doc)


INPUTS: tuple[Column, ...] = (
    _c("run_id", STRING, pa.string(), "run identifier (manifest run_id)"),
    _c("model", STRING, pa.string(), "model name as in the manifest"),
    _c("context_length", INT, pa.int64(), "target context length in tokens"),
    _c("task", STRING, pa.string(), "RULER task name"),
    _c("input_id", INT, pa.int64(), "index of the input within (run, task)"),
    _c("draw", INT, pa.int64(), "seed of the input draw"),
    _c("n_tokens", INT, pa.int64(), "prompt length T in tokens"),
    _c("drop", FLOAT, pa.float64(), "D of Eq. 3 as the collector computed it"),
    _c("agreement", FLOAT_LIST, pa.list_(pa.float32()), "a_ℓ per layer, length L"),
    _c("pair_jaccard", FLOAT_LIST, pa.list_(pa.float32()), "layer-major pair Jaccards, L·H(H−1)/2"),
    _c("signals", STRUCT, pa.struct([]), "other cheap prefill statistics", required=False),
    _c("prompt", STRING, pa.string(), "exact text given to the tokenizer"),
    _c("references", STRING_LIST, pa.list_(pa.string()), "reference answers"),
    _c("full_prediction", STRING, pa.string(), "full-KV generation"),
    _c("full_score", FLOAT, pa.float64(), "full-KV score in [0, 1]"),
    _c("full_n_generated", INT, pa.int64(), "tokens the full-KV decode generated (v2; null in upgraded v1 logs)", required=False),
    _c("full_stop_reason", STRING, pa.string(), "why the full-KV decode stopped: eos, stop or length (v2)", required=False),
    _c("prefill_ms", FLOAT, pa.float64(), "prefill wall time"),
    _c("gate_ms", FLOAT, pa.float64(), "time to compute D from the window"),
)

OUTCOMES: tuple[Column, ...] = (
    _c("run_id", STRING, pa.string()),
    _c("task", STRING, pa.string()),
    _c("input_id", INT, pa.int64()),
    _c("evictor", STRING, pa.string(), "base evictor name"),
    _c("budget", FLOAT, pa.float64(), "nominal budget b"),
    _c("n_kept", INT, pa.int64(), "prompt positions retained"),
    _c("prediction", STRING, pa.string(), "plain-eviction generation"),
    _c("score", FLOAT, pa.float64(), "A(b, x) in [0, 1]"),
    _c("decode_ms", FLOAT, pa.float64(), "decode wall time of this arm"),
    _c("n_generated", INT, pa.int64(), "tokens this arm generated (v2; null in upgraded v1 logs)", required=False),
    _c("stop_reason", STRING, pa.string(), "why this arm's decode stopped: eos, stop or length (v2)", required=False),
)

TOPK: tuple[Column, ...] = (
    _c("run_id", STRING, pa.string()),
    _c("task", STRING, pa.string()),
    _c("input_id", INT, pa.int64()),
    _c("layer", INT, pa.int64()),
    _c("head", INT, pa.int64(), "query head"),
    _c("indices", INT_LIST, pa.list_(pa.int32()), "k_max key positions, descending score, ties → lower position"),
)

TABLES: dict[str, tuple[Column, ...]] = {"inputs": INPUTS, "outcomes": OUTCOMES, "topk": TOPK}
#: Tables a run must have (topk is optional).
REQUIRED_TABLES = ("inputs", "outcomes")

#: What a manifest's ``kind`` says a run is: a *collection* (the sweep above: every input with the
#: outcomes of every arm; a manifest without ``kind`` is one) or a *deployment* (the gate deployed
#: by ``collectors.deploy`` with ``log_dir``: one row per served input, its D and the gate's decision,
#: and no counterfactual arm — no outcomes, no full-KV score; docs/SCHEMA.md "Deployment runs").
COLLECTION_KIND = "collection"
DEPLOYMENT_KIND = "deployment"
RUN_KINDS = (COLLECTION_KIND, DEPLOYMENT_KIND)
#: Why the deployed gate decided as it did (``reason``): D ≥ τ, D < τ, or a prompt shorter than w.
GATE_REASONS = ("open", "closed", "short-prompt")

_INPUT = {c.name: c for c in INPUTS}
#: A deployment run's one table, under ``<run>/inputs/``: one row per input the deployed gate saw.
DEPLOYMENT: tuple[Column, ...] = (
    _INPUT["run_id"],
    _INPUT["model"],
    _c("input_id", INT, pa.int64(), "0, 1, 2, … in the order the inputs were gated, continued by every process"),
    _INPUT["n_tokens"],
    _INPUT["drop"],
    _INPUT["agreement"],
    _INPUT["signals"],
    _c("tau", FLOAT, pa.float64(), "the threshold τ the gate used"),
    _c("gate_open", BOOL, pa.bool_(), "D ≥ τ and T ≥ w: the base evictor was applied (Eq. 2)"),
    _c("reason", STRING, pa.string(), "open, closed or short-prompt (T < w: the full cache kept)"),
    _c("n_kept", INT, pa.int64(), "kept KV positions per layer and KV head (n_tokens when closed)"),
    _c("kept_fraction", FLOAT, pa.float64(), "kept KV entries / (L · H_kv · T); 1 when closed"),
    _INPUT["gate_ms"],
    _c("logged_at", STRING, pa.string(), "ISO 8601 UTC time the row was logged"),
    _c("prediction", STRING, pa.string(), "the generated text (log_text=True)", required=False),
    _c("n_generated", INT, pa.int64(), "tokens generated, EOS included (gated_generate)", required=False),
    _c("stop_reason", STRING, pa.string(), "why the decode stopped: eos, stop or length (gated_generate)",
       required=False),
)
#: Every declared table by name: a collection run's three and ``"deployment"`` (written under ``inputs/``).
DECLARED: dict[str, tuple[Column, ...]] = {**TABLES, "deployment": DEPLOYMENT}

MANIFEST_KEYS = (
    "schema_version",
    "run_id",
    "created_at",
    "model",
    "device",
    "context_length",
    "tasks",
    "evictors",
    "budgets",
    "gate",
    "protection",
    "seed",
    "software",
    "files",
)
MANIFEST_MODEL_KEYS = ("name", "n_layers", "n_heads", "n_kv_heads", "head_dim", "dtype", "attn_impl")
MANIFEST_GATE_KEYS = ("w", "k", "k_max_stored", "bins")
MANIFEST_PROTECTION_KEYS = ("n_sink", "n_recent")
#: ``model.dtype`` values a manifest may name, with the bytes per element of the KV cache held in
#: that dtype: the torch dtype names (without ``torch.``) the collector writes (``collectors
#: --dtype``). Any other value is refused by the reader: the decision figure's GiB axis
#: (:func:`pagestats.metrics.kv_bytes_per_token`) would otherwise rest on a guess.
MODEL_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Largest ``model.n_layers``, ``n_heads``, ``n_kv_heads`` and ``head_dim`` a manifest may give
#: (2¹⁶: the KV bytes per token, 2·L·H_kv·d·bytes, then stays far inside int64).
MODEL_SIZE_MAX = 2**16


def utc_time(text: str) -> datetime:
    """An ISO 8601 time stamp (``created_at``; ``Z`` or an offset, naive read as UTC) as an
    aware datetime; raises ``ValueError`` for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not an ISO 8601 time stamp")
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def columns(table: str) -> tuple[Column, ...]:
    """Declared columns of ``table`` ("inputs", "outcomes", "topk", or "deployment")."""
    try:
        return DECLARED[table]
    except KeyError:
        raise ValueError(f"unknown table {table!r}; expected one of {sorted(DECLARED)}") from None


def arrow_schema(table: str, signal_names: tuple[str, ...] = ()) -> pa.Schema:
    """The writer's arrow schema of ``table``.

    ``signal_names`` fixes the float64 fields of the ``signals`` struct (inputs only);
    with none, the column is left out.
    """
    fields = []
    for col in columns(table):
        if col.name == "signals":
            if not signal_names:
                continue
            fields.append(pa.field("signals", pa.struct([pa.field(n, pa.float64()) for n in signal_names])))
        else:
            fields.append(pa.field(col.name, col.arrow_type))
    return pa.schema(fields)


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_float32(t) or pa.types.is_float64(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def type_problem(kind: str, t: pa.DataType) -> str | None:
    """``None`` when arrow type ``t`` is acceptable for a column of ``kind``, else a reason.

    Reader rule of docs/SCHEMA.md: any integer width for ints, float32 or float64 for floats.
    """
    ok = {
        INT: _is_int(t),
        FLOAT: _is_float(t),
        STRING: _is_string(t),
        FLOAT_LIST: _is_list(t) and _is_float(t.value_type),
        INT_LIST: _is_list(t) and _is_int(t.value_type),
        STRING_LIST: _is_list(t) and _is_string(t.value_type),
        STRUCT: pa.types.is_struct(t) and all(_is_float(t.field(i).type) for i in range(t.num_fields)),
        BOOL: pa.types.is_boolean(t),
    }[kind]
    return None if ok else f"type {t} is not acceptable for a {kind} column"


def schema_problems(table: str, schema: pa.Schema) -> list[str]:
    """Problems of a file's arrow ``schema`` against the declared ``table``: missing or mistyped columns."""
    problems = []
    for col in columns(table):
        idx = schema.get_field_index(col.name)
        if idx < 0:
            if col.required:
                problems.append(f"missing column {col.name!r}")
            continue
        reason = type_problem(col.kind, schema.field(idx).type)
        if reason:
            problems.append(f"column {col.name!r}: {reason}")
    return problems


# --------------------------------------------------------------------------- writing
# Shared by the collector and by pagestats.testing, so every writer produces the same types.


def sha256_file(path) -> str:
    """Hex sha256 of a file's bytes (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_arrow(table: str, data) -> pa.Table:
    """Cast ``data`` (a pyarrow Table, a polars DataFrame, or a dict of columns) to the
    writer's declared types of ``table``; columns are put in declared order.

    ``signals`` (inputs) keeps whatever float fields it has, cast to float64.
    """
    if isinstance(data, dict):
        data = pa.table(data)
    elif not isinstance(data, pa.Table):  # polars (or anything with to_arrow)
        data = data.to_arrow()
    signal_names: tuple[str, ...] = ()
    if table in ("inputs", "deployment") and "signals" in data.column_names:
        t = data.schema.field("signals").type
        signal_names = tuple(t.field(i).name for i in range(t.num_fields))
    target = arrow_schema(table, signal_names)
    missing = [f.name for f in target if f.name not in data.column_names]
    if missing:
        raise ValueError(f"{table}: missing columns {missing}")
    return pa.table([data.column(f.name).cast(f.type) for f in target], schema=target)


def write_parquet(table: str, data, path) -> int:
    """Write ``data`` as a current-schema ``table`` parquet file atomically (temp file + rename).

    Returns the number of rows written. A crash leaves either the old file or none, never a
    truncated one.
    """
    arrow = to_arrow(table, data)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(arrow, tmp, compression="zstd")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return arrow.num_rows


def write_manifest(run_dir, manifest: dict) -> str:
    """Write ``<run_dir>/manifest.json`` atomically, filling ``files`` with the path (relative
    to the run), sha256 and row count of every parquet file under ``inputs/``, ``outcomes/``
    and ``topk/``. ``schema_version`` is set to :data:`SCHEMA_VERSION`. Returns the path."""
    run = Path(run_dir)
    files = []
    for name in TABLES:
        if not (run / name).is_dir():
            continue
        for f in sorted(p for p in (run / name).iterdir() if p.suffix.lower() == ".parquet"):  # UPPER.PARQUET too
            files.append(
                {
                    "path": f.relative_to(run).as_posix(),
                    "sha256": sha256_file(f),
                    "rows": pq.ParquetFile(f).metadata.num_rows,
                }
            )
    out = {"schema_version": SCHEMA_VERSION, **manifest, "files": files}
    out["schema_version"] = SCHEMA_VERSION
    path = run / "manifest.json"
    tmp = run / f"manifest.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(out, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return str(path)
