"""Local-file helpers shared by both stores: OSError translation and atomic writes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from cuda_agent.storage.errors import AccessDeniedError, ObjectNotFoundError, StorageError

# Writes go to a hidden sibling first and are renamed into place; listings skip these names so a
# reader never picks up half a checkpoint shard.
PARTIAL_SUFFIX = ".partial"


@contextmanager
def os_errors(uri: str) -> Iterator[None]:
    """Turn OSErrors into StorageErrors that name `uri`."""
    try:
        yield
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(uri, "no such file") from exc
    except IsADirectoryError as exc:
        raise ObjectNotFoundError(uri, "is a directory, not an object") from exc
    except PermissionError as exc:
        raise AccessDeniedError(uri, f"permission denied ({exc.filename})") from exc
    except NotADirectoryError as exc:
        raise StorageError(uri, f"a parent of {exc.filename} is a file, not a directory") from exc
    except OSError as exc:
        raise StorageError(uri, exc.strerror or str(exc)) from exc


@contextmanager
def atomic_writer(target: Path) -> Iterator[BinaryIO]:
    """Write to a hidden sibling, fsync, then rename over `target`: after a crash the target holds the
    old or the new content, never a truncated checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}")
    # 0o666 lets the umask decide permissions as a plain open() would (mkstemp would force 0600, and a
    # shared PVC is read by pods running as other users).
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
