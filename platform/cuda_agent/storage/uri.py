"""Parsing of artifact locations: `s3://bucket/key`, `pvc://claim/path`, `file:///abs/path` and plain paths.

Parsing happens before any I/O so that a typo in a TrainingRun spec fails with the URI in the message
instead of as an opaque client error half-way through a run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from cuda_agent.storage.errors import InvalidURIError

Scheme = Literal["s3", "file", "pvc"]

# S3 bucket naming rules (lower case, digits, dots, hyphens; 3-63 characters; no leading/trailing dot
# or hyphen). Checked here so the error names the URI rather than coming from deep inside the client.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# A PersistentVolumeClaim name is a DNS-1123 subdomain.
_CLAIM = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class StorageURI:
    """A parsed location. `bucket` is the S3 bucket or the PVC claim ("" for local paths); `key` is the
    object key (S3), the path inside the claim (pvc) or the file system path (file)."""

    text: str
    scheme: Scheme
    bucket: str
    key: str

    def local_path(self, pvc_root: Path) -> Path:
        """Where a `file` or `pvc` location lives on this machine (`pvc://c/p` is mounted at pvc_root/c/p)."""
        if self.scheme == "file":
            return Path(self.key)
        if self.scheme == "pvc":
            return pvc_root / self.bucket / self.key
        raise InvalidURIError(self.text, "an s3:// URI has no local path")


def parse_uri(uri: str) -> StorageURI:
    """Parse and validate `uri`; raises InvalidURIError naming it."""
    if not uri:
        raise InvalidURIError(uri, "empty URI")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return StorageURI(uri, "file", "", uri)
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise InvalidURIError(uri, f"invalid bucket name {bucket!r} (3-63 of a-z 0-9 . -)")
        return StorageURI(uri, "s3", bucket, key)
    if scheme == "file":
        host, slash, path = rest.partition("/")
        if host not in ("", "localhost"):
            raise InvalidURIError(uri, f"file:// URIs name a local path; host {host!r} is not supported")
        if not slash:
            raise InvalidURIError(uri, "file:// URI needs an absolute path, e.g. file:///data/run")
        return StorageURI(uri, "file", "", unquote("/" + path))
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _CLAIM.match(claim):
            raise InvalidURIError(uri, f"invalid PersistentVolumeClaim name {claim!r}")
        if ".." in path.split("/"):
            raise InvalidURIError(uri, "'..' would leave the mounted claim")
        return StorageURI(uri, "pvc", claim, path)
    raise InvalidURIError(uri, f"unsupported scheme {scheme!r}; use s3://, pvc://, file:// or a plain path")


def join_uri(prefix: str, relative: str) -> str:
    """`prefix` + "/" + `relative`, with exactly one slash between them (works for every scheme)."""
    if not relative:
        return prefix
    if prefix.endswith("://"):
        return prefix + relative
    return prefix.rstrip("/") + "/" + relative.lstrip("/")
