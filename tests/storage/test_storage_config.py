"""Configuration from environment variables and Kubernetes Secrets, URI parsing and store selection.
No server needed: these check what happens before any request is sent."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from cuda_agent.storage import (
    BucketNotFoundError,
    InvalidURIError,
    LocalStore,
    StorageConfig,
    StorageConfigError,
    StorageError,
    open_store,
    parse_uri,
)
from cuda_agent.storage.s3 import S3Store


def test_from_env_reads_project_aws_and_minio_names() -> None:
    config = StorageConfig.from_env(
        {
            "CUDA_AGENT_S3_ENDPOINT": "http://minio.cuda-agent:9000",
            "MINIO_ROOT_USER": "root-user",  # used: no AWS_ACCESS_KEY_ID
            "AWS_SECRET_ACCESS_KEY": "aws-secret",  # wins over MINIO_ROOT_PASSWORD
            "MINIO_ROOT_PASSWORD": "minio-secret",
            "AWS_REGION": "eu-west-1",
            "CUDA_AGENT_S3_PART_SIZE": "128MiB",
            "CUDA_AGENT_S3_PARALLEL_UPLOADS": "4",
            "CUDA_AGENT_PVC_ROOT": "/data/pvc",
            "AWS_SESSION_TOKEN": "",  # empty counts as unset
        }
    )
    assert config.endpoint_host == "minio.cuda-agent:9000"
    assert config.use_tls is False
    assert config.endpoint_url == "http://minio.cuda-agent:9000"
    assert config.access_key == "root-user"
    assert config.secret_key is not None and config.secret_key.get_secret_value() == "aws-secret"
    assert config.session_token is None
    assert config.region == "eu-west-1"
    assert config.part_size == 128 * 1024 * 1024
    assert config.parallel_uploads == 4
    assert config.pvc_root == Path("/data/pvc")


def test_defaults_point_at_aws_over_tls() -> None:
    config = StorageConfig.from_env({})
    assert config.endpoint_url == "https://s3.amazonaws.com"
    assert config.access_key is None


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"CUDA_AGENT_S3_PART_SIZE": "1MiB"}, "CUDA_AGENT_S3_PART_SIZE"),
        ({"CUDA_AGENT_S3_PART_SIZE": "lots"}, "CUDA_AGENT_S3_PART_SIZE"),
        ({"CUDA_AGENT_S3_ENDPOINT": "ftp://host:21"}, "CUDA_AGENT_S3_ENDPOINT"),
        ({"MINIO_ENDPOINT": "http://host:9000/bucket"}, "MINIO_ENDPOINT"),
        ({"CUDA_AGENT_S3_SECURE": "perhaps"}, "CUDA_AGENT_S3_SECURE"),
        ({"AWS_CA_BUNDLE": "/no/such/ca.pem"}, "AWS_CA_BUNDLE"),
        ({"CUDA_AGENT_S3_MAX_RETRIES": "-1"}, "CUDA_AGENT_S3_MAX_RETRIES"),
    ],
)
def test_bad_environment_values_name_the_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(StorageConfigError) as caught:
        StorageConfig.from_env(environ)
    assert f"environment variable {named}=" in str(caught.value)


def test_endpoint_scheme_contradicting_secure_names_both_variables() -> None:
    with pytest.raises(StorageConfigError) as caught:
        StorageConfig.from_env({"CUDA_AGENT_S3_ENDPOINT": "http://h:9000", "CUDA_AGENT_S3_SECURE": "true"})
    assert "CUDA_AGENT_S3_ENDPOINT" in str(caught.value) and "CUDA_AGENT_S3_SECURE" in str(caught.value)


def test_secret_values_never_appear_in_errors() -> None:
    with pytest.raises(StorageConfigError) as caught:
        StorageConfig.from_env({"AWS_SECRET_ACCESS_KEY": "hunter2", "CUDA_AGENT_S3_PARALLEL_UPLOADS": "0"})
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(StorageConfig(secret_key="hunter2"))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_from_secret_decodes_data_and_prefers_string_data() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "artifacts"},
        "data": {
            "AWS_ACCESS_KEY_ID": _b64("trainer"),
            "AWS_SECRET_ACCESS_KEY": _b64("from-data"),
            "CUDA_AGENT_S3_ENDPOINT": _b64("minio:9000"),
        },
        "stringData": {"AWS_SECRET_ACCESS_KEY": "from-string-data", "CUDA_AGENT_S3_SECURE": "false"},
    }
    config = StorageConfig.from_secret(secret)
    assert config.access_key == "trainer"
    assert config.secret_key is not None and config.secret_key.get_secret_value() == "from-string-data"
    assert config.endpoint_url == "http://minio:9000"


def test_secret_errors_name_the_secret_and_key() -> None:
    with pytest.raises(StorageConfigError, match=r"Secret 'artifacts' data\.AWS_ACCESS_KEY_ID is not base64"):
        StorageConfig.from_secret({"metadata": {"name": "artifacts"}, "data": {"AWS_ACCESS_KEY_ID": "%%"}})
    with pytest.raises(StorageConfigError, match=r"Secret 'artifacts' key CUDA_AGENT_S3_PART_SIZE="):
        StorageConfig.from_secret(
            {"metadata": {"name": "artifacts"}, "stringData": {"CUDA_AGENT_S3_PART_SIZE": "2"}}
        )
    with pytest.raises(StorageConfigError, match="neither data nor stringData"):
        StorageConfig.from_secret({"metadata": {"name": "artifacts"}})


@pytest.mark.parametrize(
    ("uri", "scheme", "bucket", "key"),
    [
        ("s3://artifacts/runs/r1/step-100/model.bin", "s3", "artifacts", "runs/r1/step-100/model.bin"),
        ("s3://artifacts", "s3", "artifacts", ""),
        ("pvc://models/qwen/1.5b", "pvc", "models", "qwen/1.5b"),
        ("file:///data/run%201/x", "file", "", "/data/run 1/x"),
        ("file://localhost/data/x", "file", "", "/data/x"),
        ("/data/run/x", "file", "", "/data/run/x"),
        ("relative/dir", "file", "", "relative/dir"),
    ],
)
def test_parse_uri(uri: str, scheme: str, bucket: str, key: str) -> None:
    parsed = parse_uri(uri)
    assert (parsed.scheme, parsed.bucket, parsed.key) == (scheme, bucket, key)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("", "empty"),
        ("gs://bucket/key", "unsupported scheme 'gs'"),
        ("s3://Upper_Case/key", "invalid bucket name"),
        ("s3://ab/key", "invalid bucket name"),
        ("pvc://models/../etc/passwd", "leave the mounted claim"),
        ("pvc://Bad_Claim/x", "PersistentVolumeClaim"),
        ("file://server/share/x", "host 'server'"),
    ],
)
def test_bad_uris_are_rejected_before_any_io(uri: str, reason: str) -> None:
    with pytest.raises(InvalidURIError, match=reason) as caught:
        parse_uri(uri)
    assert caught.value.uri == uri


def test_open_store_picks_the_backend_by_scheme(tmp_path: Path) -> None:
    config = StorageConfig(endpoint="127.0.0.1:1", secure=False)
    assert isinstance(open_store("s3://artifacts/x", config), S3Store)  # no request is sent here
    for uri in ("/data/x", "file:///data/x", "pvc://claim/x"):
        assert isinstance(open_store(uri, config), LocalStore)


def test_unmounted_claim_is_a_missing_bucket(tmp_path: Path) -> None:
    store = LocalStore(StorageConfig(pvc_root=tmp_path))
    with pytest.raises(BucketNotFoundError, match=f"claim 'models' is not mounted at {tmp_path}/models"):
        store.get_bytes("pvc://models/qwen/config.json")


def test_local_writes_are_atomic_and_hide_partial_files(tmp_path: Path) -> None:
    """A write that fails half-way leaves the previous content in place and no file in listings."""
    store = LocalStore()
    target = tmp_path / "ckpt" / "model.bin"
    store.put_bytes(str(target), b"old")

    class Failing:
        def read(self, size: int = -1) -> bytes:
            raise OSError("disk went away")

    with pytest.raises(StorageError, match="disk went away"):
        store.upload_stream(Failing(), str(target))  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in target.parent.iterdir()] == ["model.bin"]
