"""Artifact storage for checkpoints, datasets and run outputs, addressed by URI.

    store = open_store("s3://artifacts/runs/r1/step-100/")
    store.upload_dir("/tmp/ckpt", "s3://artifacts/runs/r1/step-100/")

`s3://bucket/key` goes to S3Store (any S3 API, MinIO included); plain paths, `file://` and `pvc://claim/p`
go to LocalStore. Both honour the ObjectStore contract and raise StorageError subclasses naming the URI.
See docs/storage.md.
"""

from __future__ import annotations

from cuda_agent.storage.base import ObjectInfo, ObjectStore
from cuda_agent.storage.config import StorageConfig
from cuda_agent.storage.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    InvalidCredentialsError,
    InvalidURIError,
    ObjectNotFoundError,
    StorageConfigError,
    StorageError,
)
from cuda_agent.storage.local import LocalStore
from cuda_agent.storage.uri import StorageURI, join_uri, parse_uri

__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "EndpointUnreachableError",
    "InvalidCredentialsError",
    "InvalidURIError",
    "LocalStore",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "StorageConfig",
    "StorageConfigError",
    "StorageError",
    "StorageURI",
    "join_uri",
    "open_store",
    "parse_uri",
]


def open_store(uri: str, config: StorageConfig | None = None) -> ObjectStore:
    """The store that serves `uri`'s scheme. `config` defaults to StorageConfig.from_env()."""
    config = StorageConfig.from_env() if config is None else config
    if parse_uri(uri).scheme == "s3":
        # Imported here so that local-only users (the sandbox image) do not need the minio client.
        from cuda_agent.storage.s3 import S3Store

        return S3Store(config)
    return LocalStore(config)
