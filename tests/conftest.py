"""Shared pytest set-up: fixtures for the real local control plane and the real MinIO server.

Fixture modules live in tests/fixtures/ (one per real component) and are loaded as plugins here, so a
test anywhere under tests/ can ask for `kube_cluster` or `minio_server`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["fixtures.cluster", "fixtures.minio_server"]
