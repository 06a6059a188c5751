"""The judge worker's Landlock layers, applied in a child process (a layer cannot be undone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.sandbox.judge import confinement

PEEK = """
import os, sys
from cuda_agent.sandbox.judge import confinement
print(confinement.hide_processes())
def peek(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return "read"
    except OSError as exc:
        return type(exc).__name__
child = [sys.executable, "-c", "import sys; open(f'/proc/{sys.argv[1]}/cmdline').read()", str(os.getppid())]
import subprocess
print(peek(f"/proc/{os.getppid()}/cmdline"), peek("/proc/1/cmdline"), peek("/proc/self/status"),
      peek("/proc/cpuinfo"), peek(sys.executable), subprocess.run(child, capture_output=True).returncode)
"""


@pytest.mark.skipif(confinement.landlock_abi() < 1, reason="kernel without Landlock")
def test_hide_processes_leaves_only_the_callers_own_proc_entries() -> None:
    """After the layer: the parent's and pid 1's /proc entries are refused, the caller's own, /proc's
    system-wide files and the rest of the tree still read; a child cannot read its parent's either."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PEEK], capture_output=True, text=True, env=env, check=True)
    status, peeks = out.stdout.splitlines()
    assert status.startswith("on")
    assert peeks.split() == ["PermissionError", "PermissionError", "read", "read", "read", "1"]


UNDER_SERVER_RULES = """
import os, sys
from pathlib import Path
from cuda_agent.sandbox.judge import confinement
from cuda_agent.api.judge_files import JUDGE_OUTSIDE_PROC_ENV
outside = os.pathsep.join(confinement.readable_outside(Path("/proc")))  # what the server passes
reads = confinement.FS_READ_FILE | confinement.FS_READ_DIR
rules = [(Path(p), reads) for p in confinement.readable_outside(Path(sys.argv[1]))]
assert confinement._restrict_self(confinement._RulesetAttr(reads, 0, 0), 8, rules) == ""
if sys.argv[2] == "env":
    os.environ[JUDGE_OUTSIDE_PROC_ENV] = outside
print(confinement.hide_processes())
"""


@pytest.mark.skipif(confinement.landlock_abi() < 1, reason="kernel without Landlock")
@pytest.mark.parametrize("listed", ["env", "none"])
def test_hide_processes_under_the_servers_landlock_rules(tmp_path: Path, listed: str) -> None:
    """Restricted mode: the server's Landlock rules for a judge (everything but its state directory) do not
    let the judge list /, so the worker takes the tree outside /proc from the server's environment; without
    it the layer reports why it failed (the worker notes it) instead of raising. Found on the H200."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", UNDER_SERVER_RULES, str(tmp_path), listed]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout.strip()
    if listed == "env":
        assert out.startswith("on")
    else:
        assert out.startswith("failed: cannot list the tree outside /proc") and "Permission denied" in out


def test_readable_outside_covers_the_tree_but_the_hidden_paths(tmp_path: Path) -> None:
    (tmp_path / "a" / "hidden").mkdir(parents=True)
    (tmp_path / "a" / "kept").mkdir()
    (tmp_path / "b").mkdir()
    roots = confinement.readable_outside(tmp_path / "a" / "hidden", Path("/proc"))
    assert str(tmp_path / "a" / "kept") in roots and str(tmp_path / "b") in roots
    assert not any(r == "/proc" or r.startswith("/proc/") for r in roots)
    # Exact paths: sibling directories of tmp_path (other tests') may well have "hidden" in their names.
    hidden = str(tmp_path / "a" / "hidden")
    covered = (str(tmp_path), str(tmp_path / "a"), hidden)
    assert not any(r in covered or r.startswith(hidden + "/") for r in roots)
    assert "/usr" in roots
