"""Storage configuration: where the S3 endpoint is, which credentials to use, how to move large files.

The same keys work as environment variables (trainer pods get the artifact Secret through `envFrom`) and
as keys of a Kubernetes Secret (the operator reads the Secret itself), so one Secret serves both.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from cuda_agent.storage.errors import StorageConfigError

MiB = 1024 * 1024
# S3 multipart limits: every part but the last is at least 5 MiB, at most 5 GiB.
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 * 1024 * MiB

# field -> variable names, first one set wins. AWS_* names let existing tooling and SDK conventions work;
# MINIO_* names let a MinIO root-credentials Secret be used as it is.
ENV_NAMES: dict[str, tuple[str, ...]] = {
    "endpoint": ("CUDA_AGENT_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MINIO_ENDPOINT"),
    "access_key": ("AWS_ACCESS_KEY_ID", "MINIO_ACCESS_KEY", "MINIO_ROOT_USER"),
    "secret_key": ("AWS_SECRET_ACCESS_KEY", "MINIO_SECRET_KEY", "MINIO_ROOT_PASSWORD"),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("CUDA_AGENT_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION", "MINIO_REGION"),
    "secure": ("CUDA_AGENT_S3_SECURE", "MINIO_SECURE"),
    "ca_bundle": ("CUDA_AGENT_S3_CA_BUNDLE", "AWS_CA_BUNDLE"),
    "part_size": ("CUDA_AGENT_S3_PART_SIZE",),
    "parallel_uploads": ("CUDA_AGENT_S3_PARALLEL_UPLOADS",),
    "chunk_size": ("CUDA_AGENT_STORAGE_CHUNK_SIZE",),
    "connect_timeout_s": ("CUDA_AGENT_S3_CONNECT_TIMEOUT",),
    "read_timeout_s": ("CUDA_AGENT_S3_READ_TIMEOUT",),
    "max_retries": ("CUDA_AGENT_S3_MAX_RETRIES",),
    "pvc_root": ("CUDA_AGENT_PVC_ROOT",),
}


class StorageConfig(BaseModel):
    """How to reach object storage and how to stream through it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str | None = Field(
        default=None,
        description="host[:port] or http(s)://host[:port] of the S3 API; unset means AWS S3. "
        "An http:// or https:// prefix decides TLS.",
    )
    access_key: str | None = None
    secret_key: SecretStr | None = None
    session_token: SecretStr | None = None
    region: str | None = Field(default=None, description="unset: asked from the server once per bucket")
    secure: bool = Field(default=True, description="use TLS when the endpoint has no http(s):// prefix")
    ca_bundle: FilePath | None = Field(
        default=None, description="PEM file of CAs to trust instead of certifi's bundle"
    )
    part_size: Annotated[ByteSize, Field(ge=MIN_PART_SIZE, le=MAX_PART_SIZE)] = ByteSize(64 * MiB)
    parallel_uploads: int = Field(
        default=2, ge=1, le=32, description="parts in flight; memory is at most (2 * this + 1) parts"
    )
    chunk_size: Annotated[ByteSize, Field(ge=4096, le=64 * MiB)] = ByteSize(MiB)
    connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    read_timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10, description="retries of failed connects and 5xx answers")
    pvc_root: Path = Field(
        default=Path("/mnt/pvc"), description="pvc://CLAIM/p is read from pvc_root/CLAIM/p"
    )

    @property
    def endpoint_host(self) -> str:
        """host[:port] as the minio client wants it (AWS S3 when no endpoint is configured)."""
        if self.endpoint is None:
            return "s3.amazonaws.com"
        return urlsplit(self.endpoint).netloc if "://" in self.endpoint else self.endpoint

    @property
    def use_tls(self) -> bool:
        if self.endpoint is not None and "://" in self.endpoint:
            return self.endpoint.startswith("https://")
        return self.secure

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.use_tls else 'http'}://{self.endpoint_host}"

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_host_port(cls, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        parts = urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
        if parts.scheme not in ("", "http", "https"):
            raise ValueError("scheme must be http:// or https://")
        if not parts.hostname or parts.path.strip("/") or parts.query:
            raise ValueError("must be host[:port] or http(s)://host[:port], without a path")
        return endpoint

    @model_validator(mode="after")
    def _scheme_agrees_with_secure(self) -> StorageConfig:
        scheme = self.endpoint.partition("://")[0] if self.endpoint and "://" in self.endpoint else None
        if scheme and "secure" in self.model_fields_set and self.secure != (scheme == "https"):
            raise ValueError(f"endpoint {self.endpoint!r} contradicts secure={self.secure}")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StorageConfig:
        """Build from environment variables (names in ENV_NAMES); unset or empty variables keep defaults."""
        env = os.environ if environ is None else environ
        return _from_variables(env, lambda name: f"environment variable {name}")

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any]) -> StorageConfig:
        """Build from a Kubernetes Secret (as a dict): base64 `data` and plain `stringData`, the latter
        winning as it does in the API server. Keys are the environment variable names."""
        name = (secret.get("metadata") or {}).get("name", "")
        where = f"Secret {name!r}" if name else "Secret"
        if secret.get("data") is None and secret.get("stringData") is None:
            raise StorageConfigError(None, f"{where} has neither data nor stringData")
        values: dict[str, str] = {}
        for key, encoded in (secret.get("data") or {}).items():
            try:
                values[key] = base64.b64decode(str(encoded), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise StorageConfigError(None, f"{where} data.{key} is not base64 UTF-8: {exc}") from exc
        values.update({key: str(value) for key, value in (secret.get("stringData") or {}).items()})
        return _from_variables(values, lambda key: f"{where} key {key}")


def _from_variables(values: Mapping[str, str], describe: Callable[[str], str]) -> StorageConfig:
    chosen: dict[str, tuple[str, str]] = {}  # field -> (variable name, value)
    for field, names in ENV_NAMES.items():
        for name in names:
            value = values.get(name, "").strip()
            if value:
                chosen[field] = (name, value)
                break
    try:
        return StorageConfig.model_validate({field: value for field, (_, value) in chosen.items()})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            if field in chosen:
                shown = "<hidden>" if field in ("secret_key", "session_token") else repr(chosen[field][1])
                problems.append(f"{describe(chosen[field][0])}={shown} ({field}): {_message(error['msg'])}")
            else:  # a rule across fields (endpoint scheme vs secure): name every variable involved
                sources = ", ".join(describe(chosen[f][0]) for f in ("endpoint", "secure") if f in chosen)
                problems.append(f"{_message(error['msg'])} (from {sources})")
        raise StorageConfigError(None, "; ".join(problems)) from exc


def _message(pydantic_message: str) -> str:
    return pydantic_message.removeprefix("Value error, ")
