"""The one interface every artifact store offers, and the directory transfers built on top of it.

Checkpoints are directories of multi-GB shards, so the interface is about streams and files; bytes are
only for small objects (metadata, metrics, task lists).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol

from cuda_agent.storage._files import os_errors
from cuda_agent.storage.errors import ObjectNotFoundError, StorageError
from cuda_agent.storage.uri import join_uri

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object. `uri` is spelled like the prefix it was listed under (same scheme, same root)."""

    uri: str
    size: int
    modified: datetime | None = None
    etag: str | None = None


class ObjectStore(Protocol):
    """Read, write, list and delete objects named by URI. Implementations: S3Store (s3://) and
    LocalStore (paths, file://, pvc://). Failures raise StorageError subclasses naming the URI."""

    def put_bytes(self, uri: str, data: bytes) -> None: ...

    def get_bytes(self, uri: str) -> bytes: ...

    def upload_stream(self, stream: BinaryIO, uri: str, length: int | None = None) -> None:
        """Store what `stream` yields, reading at most one part at a time; `length` None means unknown."""
        ...

    def download_stream(self, uri: str, stream: BinaryIO) -> int:
        """Write the object into `stream` chunk by chunk; returns the number of bytes written."""
        ...

    def upload_file(self, path: PathLike, uri: str) -> None: ...

    def download_file(self, uri: str, path: PathLike) -> None:
        """Download to `path` atomically: readers never see a partly written file."""
        ...

    def upload_dir(self, directory: PathLike, uri: str) -> int: ...

    def download_dir(self, uri: str, directory: PathLike) -> int: ...

    def list_objects(self, uri: str) -> Iterator[ObjectInfo]:
        """Objects whose URI starts with `uri` (a key prefix, recursive), sorted by URI."""
        ...

    def stat(self, uri: str) -> ObjectInfo: ...

    def exists(self, uri: str) -> bool: ...

    def delete(self, uri: str) -> None:
        """Remove the object; removing one that is already gone is not an error (S3 semantics)."""
        ...


class DirectoryTransfers(ABC):
    """upload_file / upload_dir / download_dir written once over the per-object operations of a store."""

    @abstractmethod
    def upload_stream(self, stream: BinaryIO, uri: str, length: int | None = None) -> None: ...

    def upload_file(self, path: PathLike, uri: str) -> None:
        """The file as one object; its size goes along (S3 sizes its parts by it, both stores reject a
        short read)."""
        source = Path(path)
        with os_errors(str(source)):
            handle = source.open("rb")
        with handle:
            self.upload_stream(handle, uri, os.fstat(handle.fileno()).st_size)

    @abstractmethod
    def download_file(self, uri: str, path: PathLike) -> None: ...

    @abstractmethod
    def list_objects(self, uri: str) -> Iterator[ObjectInfo]: ...

    def upload_dir(self, directory: PathLike, uri: str) -> int:
        """Upload every file under `directory` to `uri`/<relative path>; returns the file count.
        Empty directories are not represented (object stores have none)."""
        root = Path(directory)
        if not root.is_dir():
            raise ObjectNotFoundError(str(root), "not a directory")
        count = 0
        for current, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(current) / name
                self.upload_file(path, join_uri(uri, path.relative_to(root).as_posix()))
                count += 1
        return count

    def download_dir(self, uri: str, directory: PathLike) -> int:
        """Download every object under `uri`/ into `directory`, keeping relative paths; returns the count.
        An empty prefix is an error: restoring a checkpoint from a mistyped URI must not "succeed"."""
        prefix = uri.rstrip("/") + "/"
        root = Path(directory).resolve()
        count = 0
        for info in self.list_objects(prefix):
            relative = info.uri[len(prefix) :]
            if not relative or relative.endswith("/"):
                continue  # folder marker objects some tools create
            target = (root / relative).resolve()
            # A key such as "a/../../etc/x" must not write outside the target directory.
            if not target.is_relative_to(root):
                raise StorageError(info.uri, f"key leaves the target directory {root}")
            self.download_file(info.uri, target)
            count += 1
        if count == 0:
            raise ObjectNotFoundError(prefix, "no objects under this prefix")
        return count
