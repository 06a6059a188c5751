"""The private channel: authenticated frames pass, anything forged, replayed or reflected is rejected."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from cuda_agent.sandbox.judge import channel


@pytest.fixture
def pipes() -> Iterator[tuple[int, int, int, int]]:
    to_worker_r, to_worker_w = os.pipe()
    to_orch_r, to_orch_w = os.pipe()
    yield to_worker_r, to_worker_w, to_orch_r, to_orch_w
    for fd in (to_worker_r, to_worker_w, to_orch_r, to_orch_w):
        with contextlib.suppress(OSError):
            os.close(fd)


def endpoints(pipes: tuple[int, int, int, int], key: bytes) -> tuple[channel.Endpoint, channel.Endpoint]:
    to_worker_r, to_worker_w, to_orch_r, to_orch_w = pipes
    orchestrator = channel.Endpoint(key, to_orch_r, to_worker_w, is_worker=False)
    worker = channel.Endpoint(key, to_worker_r, to_orch_w, is_worker=True)
    return orchestrator, worker


def test_round_trip_with_blobs_and_key_bootstrap(pipes: tuple[int, int, int, int]) -> None:
    key = channel.new_key()
    channel.send_key(pipes[1], key)
    assert channel.receive_key(pipes[0], deadline=None) == key
    orchestrator, worker = endpoints(pipes, key)
    worker.send({"type": "trial_result", "index": 1}, [b"\x00\x01", memoryview(b"abc")])
    header, blobs = orchestrator.receive(deadline=None)
    assert header == {"type": "trial_result", "index": 1}
    assert blobs == [b"\x00\x01", b"abc"]


def test_frame_with_wrong_key_is_forged(pipes: tuple[int, int, int, int]) -> None:
    orchestrator, _ = endpoints(pipes, channel.new_key())
    _, impostor = endpoints(pipes, channel.new_key())
    impostor.send({"type": "profile_result", "reward": 3})
    with pytest.raises(channel.ChannelForged, match="authentication"):
        orchestrator.receive(deadline=None)


def test_raw_bytes_on_the_pipe_are_forged(pipes: tuple[int, int, int, int]) -> None:
    orchestrator, _ = endpoints(pipes, channel.new_key())
    os.write(pipes[3], b'{"reward": 3}\n' + b"x" * 64)
    with pytest.raises(channel.ChannelForged):
        orchestrator.receive(deadline=None)


def test_replayed_frame_is_rejected(pipes: tuple[int, int, int, int]) -> None:
    key = channel.new_key()
    orchestrator, worker = endpoints(pipes, key)
    worker.send({"type": "a"})
    raw = os.read(pipes[2], 1 << 16)
    os.write(pipes[3], raw)
    os.write(pipes[3], raw)
    orchestrator.receive(deadline=None)
    with pytest.raises(channel.ChannelForged, match="sequence"):
        orchestrator.receive(deadline=None)


def test_reflected_frame_is_rejected(pipes: tuple[int, int, int, int]) -> None:
    """A command the orchestrator sent, copied back to it, is not a worker message."""
    key = channel.new_key()
    orchestrator, _ = endpoints(pipes, key)
    orchestrator.send({"type": "trial", "seed": 1})
    raw = os.read(pipes[0], 1 << 16)
    os.write(pipes[3], raw)
    with pytest.raises(channel.ChannelForged, match="direction"):
        orchestrator.receive(deadline=None)


def test_timeout_and_close(pipes: tuple[int, int, int, int]) -> None:
    orchestrator, _ = endpoints(pipes, channel.new_key())
    with pytest.raises(channel.ChannelTimeout):
        orchestrator.receive(deadline=0.0)
    os.close(pipes[3])
    with pytest.raises(channel.ChannelClosed):
        orchestrator.receive(deadline=None)
