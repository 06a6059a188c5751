"""Each way an S3 call can fail raises its own StorageError subclass naming the URI: against a real
MinIO server (missing bucket, wrong keys; marked `minio`) or a port where nothing listens."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import MinioEndpoint, minio_config, new_bucket

from cuda_agent.storage import (
    BucketNotFoundError,
    EndpointUnreachableError,
    InvalidCredentialsError,
    StorageConfig,
)
from cuda_agent.storage.s3 import S3Store


def _operations(store: S3Store, uri: str, tmp_path: Path) -> dict[str, object]:
    """Every operation on `uri`, as zero-argument callables (lists are consumed)."""
    return {
        "put_bytes": lambda: store.put_bytes(uri, b"x"),
        "get_bytes": lambda: store.get_bytes(uri),
        "stat": lambda: store.stat(uri),
        "exists": lambda: store.exists(uri),
        "delete": lambda: store.delete(uri),
        "list_objects": lambda: list(store.list_objects(uri)),
        "download_file": lambda: store.download_file(uri, tmp_path / "out"),
    }


@pytest.mark.minio
@pytest.mark.parametrize("region", [None, "us-east-1"])
def test_missing_bucket(minio_server: MinioEndpoint, tmp_path: Path, region: str | None) -> None:
    """With a region configured, stat/exists see only a body-less HEAD 404 (bucket or key?); the store
    still reports the missing bucket."""
    store = S3Store(minio_config(minio_server, region=region))
    uri = "s3://no-such-bucket-here/run/model.bin"
    for name, operation in _operations(store, uri, tmp_path).items():
        with pytest.raises(BucketNotFoundError) as caught:
            operation()  # type: ignore[operator]
        assert caught.value.uri == uri, name
        assert "no-such-bucket-here" in str(caught.value) and str(caught.value).startswith(uri), name


@pytest.mark.minio
@pytest.mark.parametrize("region", [None, "us-east-1"])
def test_wrong_secret_key(minio_server: MinioEndpoint, tmp_path: Path, region: str | None) -> None:
    """With a region configured the client skips its bucket-location lookup, so stat/exists see only a
    body-less HEAD 403; the store still reports bad credentials rather than a policy denial."""
    uri = new_bucket(minio_server) + "/obj"
    store = S3Store(minio_config(minio_server, secret_key="not-the-secret-key", region=region))
    for name, operation in _operations(store, uri, tmp_path).items():
        with pytest.raises(InvalidCredentialsError) as caught:
            operation()  # type: ignore[operator]
        assert caught.value.uri == uri, name
        assert "secret key" in str(caught.value), name


@pytest.mark.minio
def test_unknown_access_key(minio_server: MinioEndpoint) -> None:
    uri = new_bucket(minio_server) + "/obj"
    store = S3Store(minio_config(minio_server, access_key="nobody-by-this-name"))
    with pytest.raises(InvalidCredentialsError) as caught:
        store.get_bytes(uri)
    assert "nobody-by-this-name" in str(caught.value) and caught.value.uri == uri


@pytest.mark.minio
def test_ensure_bucket_is_idempotent(minio_server: MinioEndpoint) -> None:
    store = S3Store(minio_config(minio_server))
    uri = "s3://ensure-bucket-test/x"
    assert store.ensure_bucket(uri) is True
    assert store.ensure_bucket(uri) is False
    store.put_bytes(uri, b"ok")
    assert store.get_bytes(uri) == b"ok"


def test_unreachable_endpoint(free_port: int, tmp_path: Path) -> None:
    """Nothing listens on the port: every operation fails fast with EndpointUnreachableError that names
    the URI and the endpoint (no MinIO server needed for this one)."""
    config = StorageConfig(
        endpoint=f"http://127.0.0.1:{free_port}",
        access_key="k",
        secret_key="s",
        connect_timeout_s=1,
        max_retries=1,
    )
    store = S3Store(config)
    uri = "s3://artifacts/run/model.bin"
    for name, operation in _operations(store, uri, tmp_path).items():
        with pytest.raises(EndpointUnreachableError) as caught:
            operation()  # type: ignore[operator]
        assert caught.value.uri == uri, name
        assert f"127.0.0.1:{free_port}" in str(caught.value), name
