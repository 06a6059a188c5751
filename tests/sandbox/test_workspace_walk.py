"""The walks over trees an agent shapes (quota usage, the file tools' listing, removal) at depths where
Python's recursive os.fwalk and shutil.rmtree raise RecursionError, without following symlinks, and with
the quota walk's work bounded by the inode limit. Unit level: no server."""

from __future__ import annotations

import os
from pathlib import Path

from cuda_agent.sandbox.server.workspace_fs import (
    MAX_OPEN_DIRS,
    WorkspaceFS,
    disk_usage,
    remove_tree,
)

DEPTH = 1100


def deep_chain(root: Path, depth: int = DEPTH) -> None:
    """root/d/d/.../d with a file at the bottom, made through directory fds as an agent could."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("x" * 5000)
    os.close(fd)


def test_a_1100_level_chain_is_counted_listed_and_removed(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    deep_chain(workspace)
    usage = disk_usage([workspace], max_inodes=10_000)
    assert usage.complete and usage.inodes == DEPTH + 1 and usage.bytes >= 5000
    listed = list(WorkspaceFS(workspace, None).walk(None))
    assert [e.rel for e in listed] == ["/".join(["d"] * DEPTH) + "/bottom.txt"]
    remove_tree(workspace)
    assert not workspace.exists()


def test_the_walk_stops_at_the_inode_limit_and_at_the_branching_depth(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"e{i}").touch()
    usage = disk_usage([tmp_path], max_inodes=100)
    assert not usage.complete and usage.inodes == 101  # stopped at the limit, not after all 300
    comb = tmp_path / "comb"
    comb.mkdir()
    level = comb
    # Two subdirectories per level, the deeper one visited first (name order): every level stays open.
    for _ in range(MAX_OPEN_DIRS + 10):
        (level / "a").mkdir()
        (level / "b").mkdir()
        level = level / "a"
    assert not disk_usage([comb], max_inodes=100_000).complete


def test_symlinks_are_neither_followed_nor_counted_as_their_targets(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (1 << 20))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "link").symlink_to(outside)
    (workspace / "file-link").symlink_to(outside / "big")
    usage = disk_usage([workspace], max_inodes=100)
    assert usage.complete and usage.inodes == 2 and usage.bytes < (1 << 20)
    assert list(WorkspaceFS(workspace, None).walk(None)) == []
    remove_tree(workspace)
    assert not workspace.exists() and (outside / "big").exists()
