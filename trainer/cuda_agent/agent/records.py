"""Trajectories as JSON lines in any store `cuda_agent.storage` serves (a local path, pvc://, s3:// on
MinIO). Object stores cannot append, so records are buffered and written as numbered part files
(`<prefix>/part-00000-<writer>.jsonl`); a reader lists the prefix."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.storage import ObjectStore, join_uri, open_store


class TrajectoryWriter:
    def __init__(self, prefix: str, *, records_per_part: int = 64, store: ObjectStore | None = None) -> None:
        self.prefix = prefix
        self.records_per_part = records_per_part
        self.store = store or open_store(prefix)
        self._writer_id = uuid.uuid4().hex[:8]
        self._buffer: list[str] = []
        self._parts = 0
        self._lock = asyncio.Lock()
        self.written: list[str] = []

    async def write(self, trajectory: Trajectory) -> None:
        async with self._lock:
            self._buffer.append(trajectory.to_json())
            if len(self._buffer) >= self.records_per_part:
                await self._flush()

    async def close(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        uri = join_uri(self.prefix, f"part-{self._parts:05d}-{self._writer_id}.jsonl")
        data = ("\n".join(self._buffer) + "\n").encode()
        await asyncio.to_thread(self.store.put_bytes, uri, data)
        self._buffer.clear()
        self._parts += 1
        self.written.append(uri)


def read_trajectories(prefix: str, store: ObjectStore | None = None) -> Iterator[Trajectory]:
    """Every record under `prefix`, part by part in name order."""
    store = store or open_store(prefix)
    for info in store.list_objects(prefix):
        if info.uri.endswith(".jsonl"):
            for line in store.get_bytes(info.uri).decode().splitlines():
                if line.strip():
                    yield Trajectory.from_json(line)
