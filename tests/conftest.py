"""Shared pytest set-up: fixtures for the real local control plane and the real MinIO server.

Fixture modules live in tests/fixtures/ (one per real component) and are loaded as plugins here, so a
test anywhere under tests/ can ask for `kube_cluster` or `minio_server`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# torch's JIT extensions (DeepSpeed's shm_comm op, loaded wherever DeepSpeed's CPU accelerator sets up its
# communication: every DeepSpeed rank of the trainer tests) are kept in one folder per interpreter prefix.
# torch keys a build on its sources and flags, and the flags hold the venv's include paths: with the
# default ~/.cache/torch_extensions shared by every checkout and clone on this machine, whichever venv ran
# last made the next one rebuild the op (105 s cold, 0.3 s warm, on two busy cores), and every
# clean-clone CI run paid it. Inherited by the tests' subprocesses and Ray workers; the judge sets its own.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR",
    str(
        Path.home()
        / ".cache"
        / "cuda-agent"
        / "torch-extensions"
        / hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]
    ),
)

pytest_plugins = ["fixtures.cluster", "fixtures.minio_server"]

# Fixture names whose tests share one machine-wide resource and must run in one pytest-xdist worker
# (and one costly module fixture that should be built once):
# the local control plane's GPU nodes (tests expect every GPU free when they start) and a local Ray cluster
# (asked for by fixture, or by the `ray` marker where a test starts one itself).
_WORKER_GROUPS = {
    "kube_cluster": "cluster",
    "ray_cluster": "ray",
    "ray_local": "ray",
    "ray_session": "ray",
    "ray": "ray",
    # Not a shared resource but an expensive module fixture (a zygote that imports torch and inductor,
    # ~18 s on two cores): spread over both workers, each built its own.
    "zygote": "judge-zygote",
}


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers its mark only when loaded; a `-p no:xdist` run would warn on every grouped test.
    config.addinivalue_line("markers", "xdist_group(name): run these tests in one pytest-xdist worker")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs two xdist workers with `--dist loadgroup`; a group's tests stay in one worker.
    First among the hooks, so the marks are there when xdist's own hook reads them."""
    for item in items:
        names = set(getattr(item, "fixturenames", ())) | {m.name for m in item.iter_markers()}
        group = next((g for key, g in _WORKER_GROUPS.items() if key in names), None)
        if group is None and _uses_module_fixture(item):
            group = _module_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            _suffix_node_id(item, group)


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether the test asks (directly or through other fixtures) for a module- or class-scoped fixture:
    a sandbox server, a judge service, a tokenizer. xdist hands ungrouped tests out one at a time, so a
    module's tests landed on both workers and each worker built the module's fixtures again (two
    sandbox servers for one module, ~15-30 s each on two busy cores). Such a module is one work unit:
    its fixtures are built once, as in a one-process run."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        definitions = info.name2fixturedefs.get(name, ())
        if definitions and definitions[-1].scope in ("module", "class"):
            return True
    return False


def _module_group(item: pytest.Item) -> str:
    """The group of a module's tests: its path under tests/ without `.py` (`sandbox/test_seccomp`)."""
    path = item.nodeid.split("::", 1)[0].removesuffix(".py")
    return path.removeprefix("tests/")


def _suffix_node_id(item: pytest.Item, group: str) -> None:
    """pytest-xdist 3.8 groups by a `@group` suffix it writes to `item._nodeid`, which pytest 9 no longer
    reads (a node's id is `item._id`), so every group was silently ignored and the control plane's tests
    ran in both workers at once. Write the suffix where pytest 9 reads it, on xdist workers only."""
    if not hasattr(item.config, "workerinput") or not item.config.getvalue("loadgroup"):
        return
    from _pytest.nodeid import coerce_node_id  # private: no public way to rename a collected item

    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")
