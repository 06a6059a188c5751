"""File access inside one session's workspace on behalf of the file tools, which run in the server.

The server may be root and the agent controls the workspace's contents, so a symlink planted by the
agent must never lead the server outside. Paths are resolved component by component with O_NOFOLLOW
relative to directory fds (no check-then-open race), walks are iterative over directory fds (any
depth), writes go to a temporary file renamed into place (a planted hard link cannot redirect them),
and in root mode only files owned by the session's agent uid are read or replaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_TOOL_FILE_BYTES = 16 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ToolError(Exception):
    """A failure the agent reads as the tool's result (never an HTTP error)."""


@dataclass(frozen=True)
class FileEntry:
    rel: str
    size: int
    mtime: float


class WorkspaceFS:
    def __init__(self, root: Path, owner: tuple[int, int] | None) -> None:
        """`owner` (uid, gid): set on everything created and required of everything touched; None when
        the server and the agent share a uid (restricted mode)."""
        self.root = root
        self.owner = owner

    # ------------------------------------------------------------------ paths

    def rel(self, user_path: str) -> str:
        """The workspace-relative form of an absolute or relative path, or ToolError if it leaves."""
        if not user_path or "\x00" in user_path:
            raise ToolError("file path is empty or contains a NUL byte")
        root = str(self.root)
        joined = user_path if user_path.startswith("/") else posixpath.join(root, user_path)
        norm = posixpath.normpath(joined)
        if norm == root:
            return "."
        if not norm.startswith(root + "/"):
            raise ToolError(f"path {user_path!r} is outside the workspace {root}")
        return norm[len(root) + 1 :]

    def display(self, rel: str) -> str:
        return str(self.root) if rel == "." else f"{self.root}/{rel}"

    @contextlib.contextmanager
    def _dir(self, rel_dir: str, create: bool = False) -> Iterator[int]:
        """An fd for a workspace directory, reached without following any symlink (the workspace itself
        included: a workspace that is not a directory is a tool error, not a server error)."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise _tool_error(exc, str(self.root)) from None
        try:
            for part in [] if rel_dir in ("", ".") else rel_dir.split("/"):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    if self.owner:
                        os.fchown(nxt, *self.owner)
                except NotADirectoryError:
                    # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ENOTDIR: say which it was.
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise OSError(errno.ELOOP, "symlink") from None
                    raise
                os.close(fd)
                fd = nxt
            yield fd
        except OSError as exc:
            raise _tool_error(exc, self.display(rel_dir)) from None
        finally:
            os.close(fd)

    def _check_owner(self, st: os.stat_result, rel: str) -> None:
        if self.owner and st.st_uid != self.owner[0]:
            raise ToolError(f"{self.display(rel)} is not owned by the session user; refusing to touch it")

    # ------------------------------------------------------------------ files

    def read_bytes(self, user_path: str) -> tuple[str, bytes]:
        rel = self.rel(user_path)
        parent, name = posixpath.split(rel)
        with self._dir(parent) as dfd:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                raise _tool_error(exc, self.display(rel)) from None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{self.display(rel)} is a directory; use bash `ls` or glob")
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(f"{self.display(rel)} is not a regular file")
                self._check_owner(st, rel)
                if st.st_size > MAX_TOOL_FILE_BYTES:
                    raise ToolError(
                        f"{self.display(rel)} is {st.st_size} bytes, over the tools' "
                        f"{MAX_TOOL_FILE_BYTES} byte limit; use bash (head, sed -n) instead"
                    )
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return rel, b"".join(chunks)
            finally:
                os.close(fd)

    def exists(self, user_path: str) -> bool:
        rel = self.rel(user_path)
        parent, name = posixpath.split(rel)
        try:
            with self._dir(parent) as dfd:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
                return True
        except (ToolError, FileNotFoundError):
            return False

    def write_bytes(self, user_path: str, data: bytes) -> str:
        """Replace (or create) a file atomically; parent directories are created as needed."""
        rel = self.rel(user_path)
        if rel == ".":
            raise ToolError("cannot write to the workspace directory itself")
        if len(data) > MAX_TOOL_FILE_BYTES:
            raise ToolError(f"content is {len(data)} bytes, over the {MAX_TOOL_FILE_BYTES} byte limit")
        parent, name = posixpath.split(rel)
        with self._dir(parent, create=True) as dfd:
            try:
                old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None:
                if stat.S_ISDIR(old.st_mode):
                    raise ToolError(f"{self.display(rel)} is a directory")
                self._check_owner(old, rel)
            tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
            mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
            try:
                fd = os.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd
                )
                try:
                    if self.owner:
                        os.fchown(fd, *self.owner)
                    os.fchmod(fd, mode)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise _tool_error(exc, self.display(rel)) from None
        return rel

    # ------------------------------------------------------------------ walking

    def walk(self, user_path: str | None) -> Iterator[FileEntry]:
        """Regular files under a directory (or the one file named), symlinks neither followed nor listed."""
        rel = self.rel(user_path or ".")
        parent, name = posixpath.split(rel)
        with self._dir(parent if rel != "." else ".") as dfd:
            if rel != ".":
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError as exc:
                    raise _tool_error(exc, self.display(rel)) from None
                if stat.S_ISREG(st.st_mode):
                    yield FileEntry(rel, st.st_size, st.st_mtime)
                    return
                if not stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{self.display(rel)} is neither a file nor a directory")
            start = rel
        with self._dir(start) as top:
            yield from self._files_below(top, start)

    def _files_below(self, top: int, start: str) -> Iterator[FileEntry]:
        """Pre-order, names sorted, without recursion (os.fwalk recurses once per level, and the agent
        shapes the tree); a directory stays open only while it has unvisited subdirectories, and the
        walk does not descend below MAX_OPEN_DIRS of those."""
        stack: list[tuple[int, str, list[str]]] = []  # (fd, relative path, subdirectories left, reversed)
        fd: int | None = os.dup(top)
        rel = start
        try:
            while fd is not None or stack:
                if fd is not None:
                    files, subdirs = [], []
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            with contextlib.suppress(OSError):
                                if not entry.is_dir(follow_symlinks=False):
                                    files.append(entry.name)
                                elif entry.name not in ("__pycache__", ".git"):
                                    subdirs.append(entry.name)
                    for fname in sorted(files):
                        try:
                            st = os.stat(fname, dir_fd=fd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if stat.S_ISREG(st.st_mode) and not (self.owner and st.st_uid != self.owner[0]):
                            yield FileEntry(
                                fname if rel == "." else f"{rel}/{fname}", st.st_size, st.st_mtime
                            )
                    deeper = subdirs if len(stack) < MAX_OPEN_DIRS else []
                    stack.append((fd, rel, sorted(deeper, reverse=True)))
                    fd = None
                parent, parent_rel, pending = stack[-1]
                if not pending:
                    os.close(stack.pop()[0])
                    continue
                name = pending.pop()
                with contextlib.suppress(OSError):  # replaced by a symlink or removed: not followed
                    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                    rel = name if parent_rel == "." else f"{parent_rel}/{name}"
                if not pending:
                    os.close(stack.pop()[0])
        finally:
            if fd is not None:
                os.close(fd)
            for open_fd, _, _ in stack:
                os.close(open_fd)


@dataclass(frozen=True)
class Usage:
    """What a session's scratch directories hold. `complete` is False when the walk stopped early: at
    `max_inodes` entries (so at least that many exist), at `MAX_OPEN_DIRS` branching levels, or at a
    directory it could not open (chmod 000): either way what the tree holds is not known to be allowed."""

    bytes: int
    inodes: int
    complete: bool


# Directories kept open at once while walking; a chain of single subdirectories needs one, only a tree
# that branches at every level needs one per level.
MAX_OPEN_DIRS = 256
_GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)  # removed, or replaced by a symlink: not followed


def disk_usage(roots: list[Path], max_inodes: int) -> Usage:
    """Bytes and entries under `roots`, never following a symlink, stopping after `max_inodes` entries.

    The agent controls these trees, so the walk is iterative (a 1,100-level directory made the recursive
    os.fwalk raise RecursionError), its work is bounded by the inode limit, and it keeps a directory open
    only while it still has unvisited subdirectories.
    """
    total = inodes = 0
    for root in roots:
        try:
            top = os.open(root, _DIR_FLAGS)
        except FileNotFoundError:
            continue  # not created (yet), or gone with its session
        except OSError:  # replaced by a symlink, or unreadable: what it holds cannot be counted
            return Usage(total, inodes, complete=False)
        stack: list[tuple[int, list[str]]] = []
        fd: int | None = top
        try:
            while fd is not None or stack:
                if fd is not None:
                    subdirs: list[str] = []
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            inodes += 1
                            if inodes > max_inodes:
                                return Usage(total, inodes, complete=False)
                            with contextlib.suppress(OSError):  # vanished meanwhile
                                total += entry.stat(follow_symlinks=False).st_blocks * 512
                                if entry.is_dir(follow_symlinks=False):
                                    subdirs.append(entry.name)
                    stack.append((fd, sorted(subdirs, reverse=True)))  # visited in name order
                    fd = None
                    if len(stack) > MAX_OPEN_DIRS:
                        return Usage(total, inodes, complete=False)
                parent, pending = stack[-1]
                if not pending:
                    os.close(stack.pop()[0])
                    continue
                name = pending.pop()
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                except OSError as exc:
                    if exc.errno not in _GONE:  # unreadable (chmod 000): what it holds cannot be counted
                        return Usage(total, inodes, complete=False)
                if not pending:  # its last subdirectory: the parent is no longer needed
                    os.close(stack.pop()[0])
        finally:
            if fd is not None:
                os.close(fd)
            for open_fd, _ in stack:
                os.close(open_fd)
    return Usage(total, inodes, complete=True)


def remove_tree(path: Path) -> None:
    """`rm -rf` of a tree the agent shaped: shutil.rmtree recurses in Python (RecursionError at ~1,000
    levels, leaving the tree behind), while GNU rm walks any depth and never follows a symlink. Without
    root, directories made unreadable (chmod 000) are opened up first: they belong to our own uid then."""
    if not os.path.lexists(path):
        return
    steps = [["rm", "-rf", "--one-file-system", "--", str(path)]]
    if os.geteuid() != 0:
        steps.insert(0, ["chmod", "-R", "u+rwx", "--", str(path)])
    for argv in steps:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=600)


def _tool_error(exc: OSError, where: str) -> ToolError:
    if exc.errno == errno.ENOENT:
        return ToolError(f"file not found: {where}")
    if exc.errno == errno.ELOOP:
        return ToolError(f"{where} is (or passes through) a symlink; the file tools do not follow symlinks")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"a component of {where} is not a directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ToolError(f"workspace quota exceeded while writing {where}")
    if exc.errno == errno.EFBIG:
        return ToolError(f"file size limit exceeded while writing {where}")
    return ToolError(f"{where}: {exc.strerror or exc}")
