"""The ObjectStore contract, run against every backend: local paths, file://, pvc:// and a real MinIO
server (the `s3` parameter, marked `minio`)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from storage_helpers import (
    CHUNK_SIZE,
    PART_SIZE,
    Backend,
    GeneratedStream,
    HashingSink,
    file_sha256,
    write_generated_file,
)

from cuda_agent.storage import InvalidURIError, ObjectNotFoundError, StorageError

MiB = 1024 * 1024


def test_bytes_round_trip_and_overwrite(backend: Backend) -> None:
    uri = backend.uri("meta/run.json")
    backend.store.put_bytes(uri, b'{"step": 1}')
    assert backend.store.get_bytes(uri) == b'{"step": 1}'
    backend.store.put_bytes(uri, b'{"step": 2}')
    assert backend.store.get_bytes(uri) == b'{"step": 2}'


def test_empty_object_round_trip(backend: Backend) -> None:
    uri = backend.uri("empty")
    backend.store.put_bytes(uri, b"")
    assert backend.store.get_bytes(uri) == b""
    assert backend.store.stat(uri).size == 0


def test_stat_and_exists(backend: Backend) -> None:
    uri = backend.uri("a/b.bin")
    assert not backend.store.exists(uri)
    backend.store.put_bytes(uri, b"x" * 1234)
    assert backend.store.exists(uri)
    info = backend.store.stat(uri)
    assert info.uri == uri
    assert info.size == 1234
    assert info.modified is not None
    # A "directory" above an object is not an object, on S3 and on disk alike.
    assert not backend.store.exists(backend.uri("a"))


def test_missing_object_errors_name_the_uri(backend: Backend, tmp_path: Path) -> None:
    uri = backend.uri("no/such/object")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    for operation in (
        lambda: backend.store.get_bytes(uri),
        lambda: backend.store.stat(uri),
        lambda: backend.store.download_file(uri, downloads / "out.bin"),
        lambda: backend.store.download_stream(uri, HashingSink()),
    ):
        with pytest.raises(ObjectNotFoundError) as caught:
            operation()
        assert caught.value.uri == uri
        assert str(caught.value).startswith(uri)
    # A failed download leaves neither the target nor a partial file behind.
    assert list(downloads.iterdir()) == []


def test_delete_is_idempotent(backend: Backend) -> None:
    uri = backend.uri("to-delete")
    backend.store.put_bytes(uri, b"bye")
    backend.store.delete(uri)
    assert not backend.store.exists(uri)
    backend.store.delete(uri)  # already gone: S3 semantics, no error
    with pytest.raises(ObjectNotFoundError):
        backend.store.get_bytes(uri)


def test_list_is_recursive_sorted_and_matches_key_prefixes(backend: Backend) -> None:
    for name, size in [("ckpt/step-1/model.bin", 3), ("ckpt/step-1/opt/0.bin", 4), ("ckpt/step-10/m", 5)]:
        backend.store.put_bytes(backend.uri(name), b"z" * size)
    backend.store.put_bytes(backend.uri("ckpt/step-2.json"), b"{}")
    backend.store.put_bytes(backend.uri("other"), b"o")

    listed = [(info.uri, info.size) for info in backend.store.list_objects(backend.uri("ckpt/step-1"))]
    assert listed == [
        (backend.uri("ckpt/step-1/model.bin"), 3),
        (backend.uri("ckpt/step-1/opt/0.bin"), 4),
        (backend.uri("ckpt/step-10/m"), 5),
    ]
    in_dir = [info.uri for info in backend.store.list_objects(backend.uri("ckpt/step-1/"))]
    assert in_dir == [backend.uri("ckpt/step-1/model.bin"), backend.uri("ckpt/step-1/opt/0.bin")]
    assert len(list(backend.store.list_objects(backend.root))) == 5
    assert list(backend.store.list_objects(backend.uri("nothing-here/"))) == []


def test_multipart_file_round_trip(backend: Backend, tmp_path: Path) -> None:
    """A file of two parts (one full 5 MiB part and a remainder) goes up and comes back unchanged."""
    source = tmp_path / "shard.bin"
    digest = write_generated_file(source, PART_SIZE + 777 * 1024, seed=1)
    uri = backend.uri("ckpt/shard.bin")
    backend.store.upload_file(source, uri)

    info = backend.store.stat(uri)
    assert info.size == PART_SIZE + 777 * 1024
    if backend.name == "s3":
        # S3 gives a multipart object the ETag "<md5 of part md5s>-<part count>".
        assert info.etag is not None and info.etag.endswith("-2")

    target = tmp_path / "restored" / "shard.bin"
    backend.store.download_file(uri, target)
    assert file_sha256(target) == digest
    assert [p.name for p in target.parent.iterdir()] == ["shard.bin"]  # no partial file left


def test_streams_move_in_parts_and_chunks(backend: Backend) -> None:
    """An upload of unknown length is read one part at a time and a download written one chunk at a
    time: the largest single read/write is bounded by the configured sizes, not the object size."""
    size = 3 * PART_SIZE + 12345
    source = GeneratedStream(size, seed=2)
    uri = backend.uri("stream.bin")
    backend.store.upload_stream(source, uri)  # length unknown
    assert source.largest_read <= PART_SIZE + 1  # the client reads one byte ahead to find the end
    assert backend.store.stat(uri).size == size

    sink = HashingSink()
    assert backend.store.download_stream(uri, sink) == size
    assert sink.size == size
    assert sink.largest_write <= CHUNK_SIZE
    assert sink.sha256.hexdigest() == source.sha256.hexdigest()


def test_upload_memory_stays_at_a_few_parts(backend: Backend) -> None:
    """Peak Python memory while uploading a 16-part stream stays within a few parts, well under half the
    object size: the object is never held whole. At worst the client holds the part being read,
    `parallel_uploads` parts queued or in flight and one finished part per idle worker thread."""
    size = 16 * PART_SIZE
    bound = (2 * backend.config.parallel_uploads + 1) * PART_SIZE + 4 * MiB
    assert bound < size / 2
    source = GeneratedStream(size, seed=3)
    tracemalloc.start()
    try:
        backend.store.upload_stream(source, backend.uri("big.bin"), length=size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < bound, f"peak {peak / MiB:.1f} MiB for a {size / MiB:.0f} MiB upload"

    sink = HashingSink()
    tracemalloc.start()
    try:
        backend.store.download_stream(backend.uri("big.bin"), sink)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sink.sha256.hexdigest() == source.sha256.hexdigest()
    assert peak < 4 * CHUNK_SIZE + 4 * MiB


def test_short_stream_is_an_error_and_stores_nothing(backend: Backend) -> None:
    uri = backend.uri("short.bin")
    with pytest.raises(StorageError) as caught:
        backend.store.upload_stream(GeneratedStream(1000), uri, length=2000)
    assert caught.value.uri == uri
    assert not backend.store.exists(uri)


def test_directory_round_trip(backend: Backend, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-100"
    (checkpoint / "optimizer" / "rank0").mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"hidden": 1536}')
    (checkpoint / "optimizer" / "rank0" / "state.pt").write_bytes(b"\x00\x01" * 5000)
    (checkpoint / "empty.txt").write_bytes(b"")
    digest = write_generated_file(checkpoint / "model.safetensors", PART_SIZE + 1, seed=4)

    prefix = backend.uri("runs/r1/step-100")
    assert backend.store.upload_dir(checkpoint, prefix) == 4
    assert sorted(info.uri for info in backend.store.list_objects(prefix + "/")) == [
        prefix + "/config.json",
        prefix + "/empty.txt",
        prefix + "/model.safetensors",
        prefix + "/optimizer/rank0/state.pt",
    ]

    restored = tmp_path / "restored"
    assert backend.store.download_dir(prefix, restored) == 4
    assert (restored / "config.json").read_text() == '{"hidden": 1536}'
    assert (restored / "optimizer" / "rank0" / "state.pt").read_bytes() == b"\x00\x01" * 5000
    assert (restored / "empty.txt").read_bytes() == b""
    assert file_sha256(restored / "model.safetensors") == digest


def test_directory_errors_name_what_is_missing(backend: Backend, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError) as caught:
        backend.store.upload_dir(tmp_path / "absent", backend.uri("x"))
    assert str(tmp_path / "absent") in str(caught.value)

    prefix = backend.uri("never-written")
    with pytest.raises(ObjectNotFoundError) as caught:
        backend.store.download_dir(prefix, tmp_path / "out")
    assert prefix in str(caught.value)


def test_upload_of_missing_local_file_names_the_file(backend: Backend, tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(ObjectNotFoundError) as caught:
        backend.store.upload_file(missing, backend.uri("x"))
    assert caught.value.uri == str(missing)


def test_store_rejects_uris_it_does_not_serve(backend: Backend) -> None:
    foreign = "/tmp/x" if backend.name == "s3" else "s3://some-bucket/x"
    with pytest.raises(InvalidURIError) as caught:
        backend.store.get_bytes(foreign)
    assert caught.value.uri == foreign
    with pytest.raises(InvalidURIError):
        backend.store.put_bytes(backend.root + "/dir/", b"")  # a prefix, not an object
