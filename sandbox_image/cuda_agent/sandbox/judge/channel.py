"""The private channel between orchestrator and worker: framed, sequenced, HMAC-authenticated messages.

The orchestrator creates two pipes, passes them to the worker with `pass_fds` (never stdout) and writes a
fresh random key as the first bytes of the command pipe. Every later frame carries a direction byte, a
sequence number and an HMAC-SHA256 tag over all of it, so bytes that candidate code writes to the pipe
(without the key) are rejected as forged instead of being parsed, and old frames cannot be replayed.
Standard library only: the worker imports this before any candidate code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import struct
import time
from collections.abc import Sequence
from typing import Any

KEY_BYTES = 32
MAGIC = b"CAJ1"
# magic, direction, sequence number, header length, blob count
_PREFIX = struct.Struct("<4sBQII")
_BLOB_LEN = struct.Struct("<Q")
_TAG_BYTES = 32
MAX_HEADER_BYTES = 64 << 20
MAX_BLOBS = 4096
MAX_BLOB_BYTES = 64 << 30

TO_WORKER = 1
TO_ORCHESTRATOR = 2


class ChannelClosed(Exception):
    """The peer closed its end before a whole frame arrived."""


class ChannelTimeout(Exception):
    """No whole frame arrived before the deadline."""


class ChannelForged(Exception):
    """A frame failed authentication or framing: somebody other than the peer wrote to the pipe."""


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ChannelTimeout()
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise ChannelTimeout()
        chunk = os.read(fd, min(remaining, 1 << 22))
        if not chunk:
            raise ChannelClosed()
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send_key(fd: int, key: bytes) -> None:
    _write_all(fd, key)


def receive_key(fd: int, deadline: float | None = None) -> bytes:
    return _read_exact(fd, KEY_BYTES, deadline)


class Endpoint:
    """One direction-aware end: writes frames to `write_fd`, reads and authenticates frames from `read_fd`."""

    def __init__(self, key: bytes, read_fd: int, write_fd: int, *, is_worker: bool) -> None:
        self._key = key
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._send_direction = TO_ORCHESTRATOR if is_worker else TO_WORKER
        self._recv_direction = TO_WORKER if is_worker else TO_ORCHESTRATOR
        self._send_seq = 0
        self._recv_seq = 0

    def send(self, header: dict[str, Any], blobs: Sequence[bytes | memoryview] = ()) -> None:
        body = json.dumps(header, separators=(",", ":")).encode()
        prefix = _PREFIX.pack(MAGIC, self._send_direction, self._send_seq, len(body), len(blobs))
        lengths = b"".join(_BLOB_LEN.pack(len(memoryview(b).cast("B"))) for b in blobs)
        mac = hmac.new(self._key, prefix, hashlib.sha256)
        mac.update(lengths)
        mac.update(body)
        for blob in blobs:
            mac.update(blob)
        _write_all(self.write_fd, prefix + lengths + body)
        for blob in blobs:
            _write_all(self.write_fd, memoryview(blob).cast("B"))
        _write_all(self.write_fd, mac.digest())
        self._send_seq += 1

    def receive(self, deadline: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """Next authenticated frame; raises ChannelForged on anything else (wrong tag, order or framing)."""
        prefix = _read_exact(self.read_fd, _PREFIX.size, deadline)
        magic, direction, seq, header_len, blob_count = _PREFIX.unpack(prefix)
        if magic != MAGIC or direction != self._recv_direction:
            raise ChannelForged("frame without the judge's magic/direction")
        if header_len > MAX_HEADER_BYTES or blob_count > MAX_BLOBS:
            raise ChannelForged(f"frame sizes out of range (header {header_len}, blobs {blob_count})")
        lengths_raw = _read_exact(self.read_fd, _BLOB_LEN.size * blob_count, deadline)
        lengths = [_BLOB_LEN.unpack_from(lengths_raw, i * _BLOB_LEN.size)[0] for i in range(blob_count)]
        if any(n > MAX_BLOB_BYTES for n in lengths):
            raise ChannelForged("blob size out of range")
        body = _read_exact(self.read_fd, header_len, deadline)
        blobs = [_read_exact(self.read_fd, n, deadline) for n in lengths]
        tag = _read_exact(self.read_fd, _TAG_BYTES, deadline)
        mac = hmac.new(self._key, prefix, hashlib.sha256)
        mac.update(lengths_raw)
        mac.update(body)
        for blob in blobs:
            mac.update(blob)
        if not hmac.compare_digest(mac.digest(), tag):
            raise ChannelForged("frame failed authentication")
        if seq != self._recv_seq:
            raise ChannelForged(f"frame out of sequence (got {seq}, expected {self._recv_seq})")
        self._recv_seq += 1
        try:
            header = json.loads(body)
        except ValueError as exc:
            raise ChannelForged(f"authenticated frame with a malformed header: {exc}") from exc
        if not isinstance(header, dict):
            raise ChannelForged("authenticated frame whose header is not an object")
        return header, blobs
