"""Per-namespace storage credentials against a real MinIO server: what the chart's Job
(`python -m cuda_agent.operator.storage_tenants`) sets up lets each namespace's keys read, write, list
and prune under `s3://<bucket>/<namespace>/` and nothing else: not another namespace's checkpoints,
not the bucket's root, not another bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.minio_server import MinioServer

from cuda_agent.operator.storage_tenants import apply_tenants, main, read_tenants
from cuda_agent.storage.config import StorageConfig
from cuda_agent.storage.errors import AccessDeniedError, StorageError
from cuda_agent.storage.s3 import S3Store

BUCKET = "tenants-artifacts"


def store(server: MinioServer, access: str, secret: str) -> S3Store:
    return S3Store(StorageConfig(endpoint=f"http://{server.endpoint}", access_key=access, secret_key=secret))


def test_each_namespace_reaches_only_its_own_prefix(minio_server: MinioServer, tmp_path: Path) -> None:
    tenants_file = tmp_path / "tenants.json"
    tenants_file.write_text(
        json.dumps(
            {
                "team-a": {"accessKey": "cuda-agent-team-a", "secretKey": "secret-of-team-a"},
                "team-b": {"accessKey": "cuda-agent-team-b", "secretKey": "secret-of-team-b"},
            }
        )
    )
    endpoint = f"http://{minio_server.endpoint}"
    for _ in range(2):  # an upgrade runs the Job again: the same outcome
        apply_tenants(
            endpoint, minio_server.access_key, minio_server.secret_key, BUCKET, read_tenants(tenants_file)
        )

    a = store(minio_server, "cuda-agent-team-a", "secret-of-team-a")
    b = store(minio_server, "cuda-agent-team-b", "secret-of-team-b")
    prefix = f"s3://{BUCKET}/team-a/run/uid/checkpoints"
    a.put_bytes(f"{prefix}/ckpt-000001/state.json", b"{}")
    a.put_bytes(f"{prefix}/latest", b"ckpt-000001")  # what a trainer's CheckpointStore writes and reads
    assert a.get_bytes(f"{prefix}/latest") == b"ckpt-000001"
    assert [o.uri for o in a.list_objects(f"{prefix}/")] == [
        f"{prefix}/ckpt-000001/state.json",
        f"{prefix}/latest",
    ]
    a.delete(f"{prefix}/ckpt-000001/state.json")  # pruning old checkpoints
    b.put_bytes(f"s3://{BUCKET}/team-b/run/uid/checkpoints/latest", b"ckpt-000009")

    for attempt in (
        lambda: a.get_bytes(f"s3://{BUCKET}/team-b/run/uid/checkpoints/latest"),  # another namespace's
        lambda: a.put_bytes(f"s3://{BUCKET}/team-b/run/uid/checkpoints/latest", b"forged"),
        lambda: a.delete(f"s3://{BUCKET}/team-b/run/uid/checkpoints/latest"),
        lambda: list(a.list_objects(f"s3://{BUCKET}/team-b/")),
        lambda: list(a.list_objects(f"s3://{BUCKET}/")),  # the bucket's root
        lambda: a.put_bytes(f"s3://{BUCKET}/latest", b"x"),
        lambda: a.put_bytes(f"s3://{BUCKET}/team-ab/x", b"x"),  # a prefix that merely starts like its own
    ):
        with pytest.raises(AccessDeniedError):
            attempt()
    with pytest.raises(StorageError):
        a.ensure_bucket("s3://another-bucket/")
    assert b.get_bytes(f"s3://{BUCKET}/team-b/run/uid/checkpoints/latest") == b"ckpt-000009"


def test_the_job_needs_root_credentials_and_valid_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "tenants.json"
    bad.write_text(json.dumps({"team a": {"accessKey": "key", "secretKey": "12345678"}}))
    with pytest.raises(ValueError, match="not a namespace name"):
        read_tenants(bad)
    bad.write_text(json.dumps({"team-a": {"accessKey": "key", "secretKey": "short"}}))
    with pytest.raises(ValueError, match="secretKey"):
        read_tenants(bad)
    monkeypatch.delenv("MINIO_ROOT_USER", raising=False)
    with pytest.raises(SystemExit):
        main(["--endpoint", "http://127.0.0.1:1", "--bucket", "b", "--tenants", str(bad)])
