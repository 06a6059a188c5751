"""The private channel: authenticated frames pass, anything forged, replayed or reflected is rejected."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

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


def _send_in_thread(
    endpoint: channel.Endpoint, header: dict[str, object], blobs: list[bytes]
) -> threading.Thread:
    # Blobs larger than a pipe buffer need a concurrent reader, as between the two real processes.
    def send() -> None:
        with contextlib.suppress(BrokenPipeError):  # the reader may stop early on purpose
            endpoint.send(header, blobs)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_blobs_spanning_several_chunks_round_trip(pipes: tuple[int, int, int, int]) -> None:
    orchestrator, worker = endpoints(pipes, channel.new_key())
    big = os.urandom(2 * channel.CHUNK_BYTES + 12345)
    thread = _send_in_thread(worker, {"type": "trial_result"}, [big, b"", b"tail"])
    header, blobs = orchestrator.receive(deadline=None)
    thread.join(timeout=30)
    assert header == {"type": "trial_result"}
    assert [bytes(b) for b in blobs] == [big, b"", b"tail"]


def test_a_changed_byte_in_a_later_chunk_is_forged(pipes: tuple[int, int, int, int], tmp_path: Path) -> None:
    """Blobs are authenticated through per-chunk digests: a change deep inside a blob must still fail."""
    key = channel.new_key()
    orchestrator, _ = endpoints(pipes, key)
    blob = os.urandom(channel.CHUNK_BYTES + 100)
    # A genuine frame written to a file, one byte flipped in the blob's second chunk, then sent.
    capture = tmp_path / "frame"
    fd = os.open(capture, os.O_WRONLY | os.O_CREAT, 0o600)
    channel.Endpoint(key, -1, fd, is_worker=True).send({"type": "trial_result"}, [blob])
    os.close(fd)
    frame = bytearray(capture.read_bytes())
    frame[-40] ^= 0xFF  # inside the blob's last chunk, before the 32-byte tag
    writer = _raw_writer(pipes[3], bytes(frame))
    with pytest.raises(channel.ChannelForged, match="authentication"):
        orchestrator.receive(deadline=None)
    writer.join(timeout=30)


def _raw_writer(fd: int, data: bytes) -> threading.Thread:
    def write() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_blob_larger_than_the_receiver_allows_is_forged(pipes: tuple[int, int, int, int]) -> None:
    orchestrator, worker = endpoints(pipes, channel.new_key())
    orchestrator.max_blob_bytes = 1024
    thread = _send_in_thread(worker, {"type": "trial_result"}, [b"x" * 4096])
    with pytest.raises(channel.ChannelForged, match="blob size out of range"):
        orchestrator.receive(deadline=None)
    os.close(pipes[2])  # unblock the sender
    thread.join(timeout=30)
