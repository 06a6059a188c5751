"""Reading and writing published task sets, from a local path or object storage (s3:// through
cuda_agent.storage; nothing is downloaded from the internet):
- the released Ops-6K layout: a parquet file with columns `ops`, `data_source`, `code` (ours adds `id`,
  `composer`, `verdicts`, `accepted`, `rejected_by`). `ops` is read as a list of strings or as a string
  holding a JSON / Python list, since both spellings occur in exported copies.
- KernelBench's folder layout: `level1/19_ReLU.py`, `level2/...`; any `*.py` under the root that defines
  `class Model` is a task, named by its path relative to the root (a flat folder like examples/tasks works).
"""

from __future__ import annotations

import ast
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.data.records import Sample
from cuda_agent.storage import open_store, parse_uri

OPS6K_COLUMNS = ("ops", "data_source", "code")


@dataclass(frozen=True)
class BenchmarkTask:
    name: str  # path relative to the set's root, e.g. level1/19_ReLU.py
    level: str | None  # "level1" when the first folder is a level, else None
    code: str


def _is_s3(uri: str) -> bool:
    return parse_uri(uri).scheme == "s3"


def read_bytes(uri: str) -> bytes:
    return open_store(uri).get_bytes(uri)


def write_bytes(uri: str, data: bytes) -> None:
    open_store(uri).put_bytes(uri, data)


def _parse_ops(value: Any, where: str) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if isinstance(value, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                parsed = parse(value)
            except (ValueError, SyntaxError):
                continue
            if isinstance(parsed, list | tuple):
                return [str(v) for v in parsed]
        return [value]
    raise ValueError(f"{where}: column ops has a {type(value).__name__}, not a list or string")


def read_ops6k(uri: str) -> list[Sample]:
    """Samples of an Ops-6K-layout parquet file; a missing column is an error naming file and column."""
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(read_bytes(uri)))
    missing = [c for c in OPS6K_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{uri}: not the Ops-6K layout, missing column(s) {', '.join(missing)}")
    samples = []
    for row, record in enumerate(table.to_pylist()):
        where = f"{uri} row {row}"
        samples.append(
            Sample(
                id=str(record.get("id") or f"ops6k-{row:05d}"),
                ops=_parse_ops(record["ops"], where),
                data_source=str(record["data_source"]),
                code=str(record["code"]),
                composer=str(record.get("composer") or "published"),
                verdicts=record.get("verdicts") or [],
                accepted=bool(record.get("accepted", False)),
                rejected_by=record.get("rejected_by"),
            )
        )
    return samples


def ops6k_parquet(samples: Sequence[Sample]) -> bytes:
    """Parquet bytes in the Ops-6K layout (ops as list<string>) plus our columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [s.model_dump(mode="json") for s in samples]
    schema = pa.schema(
        [
            ("ops", pa.list_(pa.string())),
            ("data_source", pa.string()),
            ("code", pa.string()),
            ("id", pa.string()),
            ("composer", pa.string()),
            (
                "verdicts",
                pa.list_(
                    pa.struct(
                        [
                            ("filter", pa.string()),
                            ("passed", pa.bool_()),
                            ("detail", pa.string()),
                            ("value", pa.float64()),
                        ]
                    )
                ),
            ),
            ("accepted", pa.bool_()),
            ("rejected_by", pa.string()),
        ]
    )
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    return buffer.getvalue()


def write_ops6k(samples: Sequence[Sample], uri: str) -> None:
    write_bytes(uri, ops6k_parquet(samples))


def jsonl(samples: Sequence[Sample]) -> bytes:
    return "".join(s.model_dump_json() + "\n" for s in samples).encode()


def read_jsonl(data: bytes, where: str) -> list[Sample]:
    samples = []
    for number, line in enumerate(data.decode().splitlines(), 1):
        if line.strip():
            try:
                samples.append(Sample.model_validate_json(line))
            except ValueError as exc:
                raise ValueError(f"{where} line {number}: {exc}") from exc
    return samples


def read_kernelbench(uri: str) -> list[BenchmarkTask]:
    """Tasks of a KernelBench-layout folder (local path or s3:// prefix), sorted by name."""
    files: list[tuple[str, str]] = []
    if _is_s3(uri):
        store = open_store(uri)
        prefix = uri.rstrip("/") + "/"
        for info in store.list_objects(prefix):
            if info.uri.endswith(".py"):
                files.append((info.uri[len(prefix) :], store.get_bytes(info.uri).decode()))
    else:
        root = Path(parse_uri(uri).key)
        if not root.is_dir():
            raise ValueError(f"benchmark set {uri}: not a directory")
        files = [(p.relative_to(root).as_posix(), p.read_text()) for p in sorted(root.rglob("*.py"))]
    tasks = []
    for name, code in sorted(files):
        if "class Model" not in code:
            continue  # helpers and __init__.py files of the layout
        first = name.split("/", 1)[0]
        level = first if "/" in name and first.startswith("level") else None
        tasks.append(BenchmarkTask(name, level, code))
    if not tasks:
        raise ValueError(f"benchmark set {uri}: no task files (*.py defining class Model)")
    return tasks
