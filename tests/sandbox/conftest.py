"""Fixtures of the sandbox server tests: one server per test module, one fresh session per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_helpers import TASK, RunningServer, cleanup, start_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server()
    try:
        yield running
    finally:
        cleanup(running)


@pytest.fixture
def session_id(server: RunningServer) -> Iterator[str]:
    info = server.client.create_session(TASK, name="relu_mul")
    try:
        yield info.session_id
    finally:
        if server.proc.poll() is None:
            server.client.request("DELETE", f"/v1/sessions/{info.session_id}")
