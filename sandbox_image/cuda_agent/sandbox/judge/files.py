"""The judge's file contract: which files make up the judge, the frozen files every workspace gets, and how
both are hashed.

Standard library only: the operator (no torch, no sandbox dependencies) ships these files in a ConfigMap and
stamps their digest on the pods; the server hashes them before every judge run; the judge hashes its own
directory around each run. All three must agree on what "the judge's files" are, so they live here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

# The judge's own files that a workspace includes (the CUDA Agent release's layout): copied into a session's
# kernels/, and at the workspace root when the judge builds (`#include "../binding_registry.h"`).
FROZEN_FILES = ("binding.cpp", "binding_registry.h")
FROZEN_SUBDIR = "frozen"
# Never part of the judge: bytecode caches (the judge never writes them; the interpreter may) and VCS data.
SKIP_DIRS = frozenset({"__pycache__", ".git"})
# What the operator ships in the judge ConfigMap (text only): the sources, and the frozen C++ files that
# sessions copy into kernels/ (without .cpp/.h a pod's sessions would get no binding files).
SHIPPED_SUFFIXES = (".py", ".json", ".md", ".cpp", ".h")
# The judge's environment, set by the session server (and by hand for the CLI): the writable content-addressed
# build cache, and the optional read-only seed of precompiled headers (`cuda-agent judge-seed`; trusted input:
# only the image or the server's operator may write it, never a judge or an agent; docs/judge.md).
JUDGE_CACHE_ENV = "CUDA_AGENT_JUDGE_CACHE"
JUDGE_SEED_ENV = "CUDA_AGENT_JUDGE_SEED"
# The tree outside /proc as the server lists it (os.pathsep-separated): a judge under the server's Landlock
# rules may not list / itself, and its worker needs the list to hide other processes (confinement.py).
JUDGE_OUTSIDE_PROC_ENV = "CUDA_AGENT_JUDGE_OUTSIDE_PROC"
# The user every judge process (zygote, judge, worker) names in USER/LOGNAME: getpass.getuser(), which
# inductor's cache paths call, raises for a uid without a passwd entry (a pod's arbitrary runAsUser).
JUDGE_USER = "cuda-agent-judge"
# Where the sandbox image keeps its seed (built at image build time, root-owned on a read-only root fs).
IMAGE_JUDGE_SEED_DIR = "/opt/cuda-agent/judge-seed"


def package_judge_dir() -> Path:
    """The installed judge package: this module's own directory, so this contract is among the files it
    hashes and ships (the package's __init__ imports nothing, so the operator imports this without torch)."""
    return Path(__file__).resolve().parent


def judge_entries(root: Path) -> Iterator[Path]:
    """Every file and symbolic link under root, in a fixed order, skipping SKIP_DIRS; links are not
    followed (a ConfigMap volume is a tree of links into a timestamped directory)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        links = [d for d in dirnames if Path(dirpath, d).is_symlink()]
        for name in sorted([*filenames, *links]):
            yield Path(dirpath, name)


def entry_digest(path: Path) -> str | None:
    """sha256 of a regular file; of a link's target text plus, when it resolves to a file, its content
    (retargeting a link and rewriting its file both change it); None for anything else."""
    if path.is_symlink():
        digest = hashlib.sha256(b"symlink\0" + os.readlink(path).encode() + b"\0")
        if path.is_file():
            digest.update(path.read_bytes())
        return "link:" + digest.hexdigest()
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return None


def hash_judge_dir(root: Path) -> dict[str, str]:
    """Relative path -> digest of every judge file under root; empty when root is not a directory."""
    digests: dict[str, str] = {}
    if not root.is_dir():
        return digests
    for path in judge_entries(root):
        digest = entry_digest(path)
        if digest is not None:
            digests[str(path.relative_to(root))] = digest
    return digests


def changed_paths(baseline: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Paths added, removed or changed between two hash_judge_dir results."""
    return sorted(k for k in set(baseline) | set(current) if baseline.get(k) != current.get(k))


def shipped_judge_files(root: Path) -> dict[str, str]:
    """The judge's text files (relative path -> text) that the operator ships to the pods."""
    if not root.is_dir():
        return {}
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for path in judge_entries(root)
        if path.is_file() and not path.is_symlink() and path.suffix in SHIPPED_SUFFIXES
    }


def shipped_digest(files: Mapping[str, str]) -> str:
    """A short digest of shipped_judge_files (the pods' judge-hash annotation: a change rolls them)."""
    digest = hashlib.sha256()
    for path, content in sorted(files.items()):
        digest.update(path.encode() + b"\0" + content.encode() + b"\0")
    return digest.hexdigest()[:16]
