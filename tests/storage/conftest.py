"""Backends for the storage contract tests: one suite runs against the local file system (plain paths,
file:// and pvc://) and against a real MinIO server (the session fixture `minio_server`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_helpers import CHUNK_SIZE, PART_SIZE, Backend, minio_config, new_bucket

from cuda_agent.storage import StorageConfig, open_store


@pytest.fixture(params=["path", "file", "pvc", pytest.param("s3", marks=pytest.mark.minio)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind = request.param
    if kind == "s3":
        server = request.getfixturevalue("minio_server")
        config = minio_config(server)
        root = new_bucket(server) + "/prefix"
    else:
        config = StorageConfig(part_size=PART_SIZE, chunk_size=CHUNK_SIZE, pvc_root=tmp_path / "mnt")
        if kind == "pvc":
            (tmp_path / "mnt" / "claim").mkdir(parents=True)
            root = "pvc://claim/prefix"
        elif kind == "file":
            root = (tmp_path / "files").as_uri()
        else:
            root = str(tmp_path / "plain")
    return Backend(kind, open_store(root, config), root, config)


@pytest.fixture
def free_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port
