"""Shared pytest set-up: fixtures for the real local control plane and the real MinIO server.

Fixture modules live in tests/fixtures/ (one per real component) and are loaded as plugins here, so a
test anywhere under tests/ can ask for `kube_cluster` or `minio_server`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["fixtures.cluster", "fixtures.minio_server"]

# Fixture names whose tests share one machine-wide resource and must run in one pytest-xdist worker:
# the local control plane's GPU nodes (tests expect every GPU free when they start) and a local Ray cluster
# (asked for by fixture, or by the `ray` marker where a test starts one itself).
_WORKER_GROUPS = {
    "kube_cluster": "cluster",
    "ray_cluster": "ray",
    "ray_local": "ray",
    "ray_session": "ray",
    "ray": "ray",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs two xdist workers with `--dist loadgroup`; a group's tests stay in one worker."""
    for item in items:
        names = set(getattr(item, "fixturenames", ())) | {m.name for m in item.iter_markers()}
        group = next((g for key, g in _WORKER_GROUPS.items() if key in names), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
