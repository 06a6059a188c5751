"""The judge's file contract: which files make up the judge, the frozen files every workspace gets, how both
are hashed, and the environment the server gives the judge.

Standard library only: the operator (no torch, no sandbox dependencies) ships the judge's files in a ConfigMap
and stamps their digest on the pods; the server hashes them before every judge run; the judge hashes them
around each run, and its worker reads the environment names. All of them must agree on what "the judge's
files" are, so that lives here, in the bottom layer every part imports.
"""

from __future__ import annotations

import hashlib
import importlib.util
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


# The modules of this layer that every judge process runs, and the package __init__ that importing them
# executes: the judge's shared types (its options, tolerances, verdict, milestone_reward) and this contract.
# They count among the judge's files wherever those are hashed (hash_judge_files), so a change to a tolerance
# default or to milestone_reward is caught like a change inside the judge's own directory.
JUDGE_CONTRACT_MODULES = ("__init__.py", "judge.py", "judge_files.py")
# Their relative paths among the judge's hashed files: a name no file of the judge's directory can have.
JUDGE_CONTRACT_PREFIX = "cuda_agent.api:"
JUDGE_PACKAGE = "cuda_agent.sandbox.judge"


def package_judge_dir() -> Path:
    """The installed judge package's directory, found without importing it (it needs torch, which the
    operator image does not have; finding it imports only cuda_agent.sandbox, whose __init__ is empty)."""
    spec = importlib.util.find_spec(JUDGE_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"the judge package {JUDGE_PACKAGE} is not installed")
    return Path(spec.origin).resolve().parent


def contract_dir() -> Path:
    """Where this layer's modules (JUDGE_CONTRACT_MODULES) are installed: this module's own directory."""
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


def hash_judge_files(judge_dir: Path) -> dict[str, str]:
    """hash_judge_dir(judge_dir) and the judge's contract modules of this layer (JUDGE_CONTRACT_MODULES, under
    JUDGE_CONTRACT_PREFIX): everything of cuda-agent's own that a judge process runs."""
    digests = hash_judge_dir(judge_dir)
    for name in JUDGE_CONTRACT_MODULES:
        digest = entry_digest(contract_dir() / name)
        if digest is not None:
            digests[JUDGE_CONTRACT_PREFIX + name] = digest
    return digests


def changed_paths(baseline: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Paths added, removed or changed between two hash_judge_dir (or hash_judge_files) results."""
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
