"""Trajectory records as JSON-lines part files, on a local path and on a real MinIO server."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.agent import JudgeVerdict, Trajectory, TrajectoryWriter, TurnRecord, read_trajectories
from cuda_agent.storage import ObjectStore, StorageConfig, open_store


def trajectory(i: int) -> Trajectory:
    return Trajectory(
        episode_id=f"ep{i}",
        task_name="relu_mul_add",
        prompt_length=3,
        token_ids=[1, 2, 3, 10 + i, 11, 12],
        loss_mask=[0, 0, 0, 1, 1, 0],
        logprobs=[0.0, 0.0, 0.0, -0.5, -1.25, 0.0],
        reward=float(i % 3 or -1),
        verdict=JudgeVerdict(reward=i % 3 or -1, correct=i % 3 > 0),
        end="finished",
        turns=[TurnRecord(generated_tokens=2, observation_tokens=1, generate_s=0.1, tools_s=0.2)],
        invalid_tool_call_kinds={"malformed": i},
        invalid_tool_calls=i,
    )


def write_and_read(prefix: str, store: ObjectStore) -> tuple[list[str], list[Trajectory]]:
    async def main() -> list[str]:
        writer = TrajectoryWriter(prefix, records_per_part=2, store=store)
        for i in range(5):
            await writer.write(trajectory(i))
        await writer.close()
        return writer.written

    written = asyncio.run(main())
    return written, list(read_trajectories(prefix, store))


def test_records_on_a_local_path(tmp_path: Path) -> None:
    prefix = str(tmp_path / "runs" / "r1" / "episodes")
    written, back = write_and_read(prefix, open_store(prefix))
    assert len(written) == 3 and all(w.endswith(".jsonl") for w in written)
    assert back == [trajectory(i) for i in range(5)]


@pytest.mark.minio
def test_records_on_minio(minio_server: Any) -> None:
    config = StorageConfig(
        endpoint=minio_server.endpoint,
        access_key=minio_server.access_key,
        secret_key=minio_server.secret_key,
        secure=minio_server.secure,
        max_retries=1,
    )
    from cuda_agent.storage.s3 import S3Store

    store = S3Store(config)
    bucket = f"s3://traj-{uuid.uuid4().hex[:12]}"
    store.ensure_bucket(bucket)
    written, back = write_and_read(f"{bucket}/runs/r1/episodes", store)
    assert len(written) == 3 and all(w.startswith(bucket) for w in written)
    assert back == [trajectory(i) for i in range(5)]
