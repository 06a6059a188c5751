"""Artifact store on the local file system: plain paths, `file://` URIs and `pvc://` claims (in a pod,
a PersistentVolumeClaim is just a mounted directory). Same contract as S3Store, so the embedded
single-machine path and the cluster path run the same trainer code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from cuda_agent.storage._files import PARTIAL_SUFFIX, atomic_writer, os_errors
from cuda_agent.storage.base import DirectoryTransfers, ObjectInfo, PathLike
from cuda_agent.storage.config import StorageConfig
from cuda_agent.storage.errors import BucketNotFoundError, InvalidURIError, StorageError
from cuda_agent.storage.uri import StorageURI, parse_uri


class LocalStore(DirectoryTransfers):
    """ObjectStore over a local directory tree."""

    def __init__(self, config: StorageConfig | None = None) -> None:
        self._config = config or StorageConfig()

    # -- naming ---------------------------------------------------------------------------------------

    def _location(self, uri: str) -> StorageURI:
        location = parse_uri(uri)
        if location.scheme == "s3":
            raise InvalidURIError(uri, "LocalStore handles paths, file:// and pvc://; open_store() picks S3")
        if location.scheme == "pvc":
            claim_root = self._config.pvc_root / location.bucket
            if not claim_root.is_dir():
                raise BucketNotFoundError(uri, f"claim {location.bucket!r} is not mounted at {claim_root}")
        return location

    def _object_path(self, uri: str) -> Path:
        location = self._location(uri)
        if not location.key or uri.endswith("/"):
            raise InvalidURIError(uri, "names a directory, not an object")
        return location.local_path(self._config.pvc_root)

    # -- small objects --------------------------------------------------------------------------------

    def put_bytes(self, uri: str, data: bytes) -> None:
        with os_errors(uri), atomic_writer(self._object_path(uri)) as out:
            out.write(data)

    def get_bytes(self, uri: str) -> bytes:
        path = self._object_path(uri)
        with os_errors(uri):
            return path.read_bytes()

    # -- streams and files ----------------------------------------------------------------------------

    def upload_stream(self, stream: BinaryIO, uri: str, length: int | None = None) -> None:
        target = self._object_path(uri)
        with os_errors(uri), atomic_writer(target) as out:
            copied = self._copy(stream, out, length)
            if length is not None and copied != length:
                raise StorageError(uri, f"stream ended after {copied} of {length} bytes")

    def download_stream(self, uri: str, stream: BinaryIO) -> int:
        path = self._object_path(uri)
        with os_errors(uri), path.open("rb") as source:
            return self._copy(source, stream, None)

    def download_file(self, uri: str, path: PathLike) -> None:
        source = self._object_path(uri)
        with os_errors(uri):
            handle = source.open("rb")
        with handle, os_errors(str(path)), atomic_writer(Path(path)) as out:
            self._copy(handle, out, None)

    # -- metadata -------------------------------------------------------------------------------------

    def list_objects(self, uri: str) -> Iterator[ObjectInfo]:
        location = self._location(uri)
        base = location.local_path(self._config.pvc_root)
        if not location.key or uri.endswith("/"):
            directory, name_prefix, uri_base = base, "", uri.rstrip("/") + "/"
        else:
            # Like an S3 prefix, "ckpt/step-1" matches "ckpt/step-1/..." and "ckpt/step-10/...".
            directory, name_prefix = base.parent, base.name
            uri_base = uri.rpartition("/")[0] + "/" if "/" in uri else ""
        found: list[ObjectInfo] = []
        with os_errors(uri):
            for current, dirnames, filenames in os.walk(directory):
                if Path(current) == directory:
                    dirnames[:] = [name for name in dirnames if name.startswith(name_prefix)]
                for name in filenames:
                    path = Path(current) / name
                    relative = path.relative_to(directory).as_posix()
                    if name.endswith(PARTIAL_SUFFIX) or not relative.startswith(name_prefix):
                        continue
                    try:
                        status = path.stat()
                    except FileNotFoundError:
                        continue  # deleted while listing
                    modified = datetime.fromtimestamp(status.st_mtime, UTC)
                    found.append(ObjectInfo(uri_base + relative, status.st_size, modified))
        return iter(sorted(found, key=lambda info: info.uri))

    def stat(self, uri: str) -> ObjectInfo:
        path = self._object_path(uri)
        with os_errors(uri):
            status = path.stat()
            if path.is_dir():
                raise IsADirectoryError(path)
        return ObjectInfo(uri, status.st_size, datetime.fromtimestamp(status.st_mtime, UTC))

    def exists(self, uri: str) -> bool:
        return self._object_path(uri).is_file()

    def delete(self, uri: str) -> None:
        path = self._object_path(uri)
        with os_errors(uri):
            path.unlink(missing_ok=True)

    # -- helpers --------------------------------------------------------------------------------------

    def _copy(self, source: BinaryIO, target: BinaryIO, length: int | None) -> int:
        """Copy in chunk_size pieces (bounded memory); stop after `length` bytes when it is given."""
        chunk, copied = self._config.chunk_size, 0
        while length is None or copied < length:
            data = source.read(chunk if length is None else min(chunk, length - copied))
            if not data:
                break
            target.write(data)
            copied += len(data)
        return copied
