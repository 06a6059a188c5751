"""Artifact store on an S3 API (MinIO in the embedded and Helm deployments, any S3 elsewhere), through
the `minio` client. Large objects stream through multipart uploads of `part_size` parts with at most
`parallel_uploads` parts in flight, so memory stays at a few parts whatever the checkpoint size."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError
from urllib3.exceptions import (
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.util import Retry, Timeout

from cuda_agent.storage._files import atomic_writer, os_errors
from cuda_agent.storage.base import DirectoryTransfers, ObjectInfo, PathLike
from cuda_agent.storage.config import StorageConfig
from cuda_agent.storage.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    InvalidCredentialsError,
    InvalidURIError,
    ObjectNotFoundError,
    StorageError,
)
from cuda_agent.storage.uri import parse_uri

_MAX_PARTS = 10_000
_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}


def make_client(config: StorageConfig) -> Minio:
    """A minio client whose HTTP pool has a short connect timeout and few retries: the client's own
    defaults (5 minutes, 5 retries) would make an unreachable endpoint look like a hang."""
    retries = Retry(
        total=config.max_retries,
        connect=config.max_retries,
        backoff_factor=0.2,
        status_forcelist=[500, 502, 503, 504],
        # After the last retry hand the 5xx answer to the client, whose XML error code says more
        # than urllib3's "too many 500 error responses".
        raise_on_status=False,
    )
    default_cas = os.environ.get("SSL_CERT_FILE") or certifi.where()
    ca_certs = str(config.ca_bundle) if config.ca_bundle else default_cas
    http = urllib3.PoolManager(
        timeout=Timeout(connect=config.connect_timeout_s, read=config.read_timeout_s),
        maxsize=max(10, config.parallel_uploads + 1),
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_certs,
        retries=retries,
    )
    return Minio(
        config.endpoint_host,
        access_key=config.access_key,
        secret_key=config.secret_key.get_secret_value() if config.secret_key else None,
        session_token=config.session_token.get_secret_value() if config.session_token else None,
        secure=config.use_tls,
        region=config.region,
        http_client=http,
    )


class S3Store(DirectoryTransfers):
    """ObjectStore over `s3://bucket/key` URIs."""

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._client = make_client(config)

    # -- naming and errors ----------------------------------------------------------------------------

    def _bucket_key(self, uri: str, *, object_required: bool = True) -> tuple[str, str]:
        location = parse_uri(uri)
        if location.scheme != "s3":
            raise InvalidURIError(uri, "S3Store handles s3:// URIs; open_store() picks the local store")
        if object_required and (not location.key or location.key.endswith("/")):
            raise InvalidURIError(uri, "names a bucket or prefix, not an object")
        return location.bucket, location.key

    @contextmanager
    def _errors(self, uri: str) -> Iterator[None]:
        """Translate client and transport exceptions into StorageErrors naming `uri`."""
        try:
            yield
        except S3Error as exc:
            raise self._from_s3_error(uri, exc) from exc
        except MaxRetryError as exc:
            raise self._transport_error(uri, exc.reason or exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._transport_error(uri, exc) from exc
        except (InvalidResponseError, ServerError) as exc:
            raise StorageError(uri, f"unexpected answer from {self._config.endpoint_url}: {exc}") from exc

    def _from_s3_error(self, uri: str, exc: S3Error) -> StorageError:
        where, code = self._config.endpoint_url, exc.code or ""
        access_key = self._config.access_key
        if code == "NoSuchBucket":
            return BucketNotFoundError(uri, f"bucket {parse_uri(uri).bucket!r} does not exist at {where}")
        if code == "NoSuchKey":
            return ObjectNotFoundError(uri, "no such object")
        if code == "InvalidAccessKeyId":
            return InvalidCredentialsError(uri, f"access key {access_key!r} is not known to {where}")
        if code == "SignatureDoesNotMatch":
            return InvalidCredentialsError(uri, f"{where} rejected the secret key for {access_key!r}")
        if code in _CREDENTIAL_CODES:
            return InvalidCredentialsError(uri, f"{where} rejected the session token: {code}")
        if code in ("AccessDenied", "AllAccessDisabled"):
            return AccessDeniedError(uri, f"{where} denied access to access key {access_key!r} ({code})")
        if code == "InvalidBucketName":
            return InvalidURIError(uri, f"{where} rejected the bucket name: {exc.message}")
        return StorageError(uri, f"{where} answered {code}: {exc.message}")

    def _transport_error(self, uri: str, reason: BaseException) -> StorageError:
        where, retries = self._config.endpoint_url, self._config.max_retries
        if isinstance(reason, SSLError):
            return EndpointUnreachableError(uri, f"TLS connection to {where} failed: {reason}")
        if isinstance(reason, NewConnectionError):
            return EndpointUnreachableError(
                uri, f"cannot connect to {where} after {retries} retries: {reason}"
            )
        if isinstance(reason, ConnectTimeoutError):
            seconds = self._config.connect_timeout_s
            message = f"connecting to {where} timed out ({seconds}s, {retries} retries)"
            return EndpointUnreachableError(uri, message)
        if isinstance(reason, ReadTimeoutError):
            seconds = self._config.read_timeout_s
            return EndpointUnreachableError(uri, f"{where} did not answer within {seconds}s")
        if isinstance(reason, ProtocolError):
            return EndpointUnreachableError(uri, f"connection to {where} broke: {reason}")
        return StorageError(uri, f"HTTP error talking to {where}: {reason}")

    def _explain_head_error(self, uri: str, bucket: str, key: str, original: StorageError) -> StorageError:
        """HEAD answers carry no error body: a 404 cannot tell a missing bucket from a missing key, a 403
        cannot tell a wrong secret key from a policy denial. A one-byte GET gets the server's own code."""
        try:
            with self._errors(uri):
                response = self._client.get_object(bucket, key, offset=0, length=1)
                response.close()
                response.release_conn()
        except (BucketNotFoundError, ObjectNotFoundError, AccessDeniedError) as refined:
            return refined
        except StorageError:
            pass
        return original

    # -- small objects --------------------------------------------------------------------------------

    def put_bytes(self, uri: str, data: bytes) -> None:
        self.upload_stream(io.BytesIO(data), uri, len(data))

    def get_bytes(self, uri: str) -> bytes:
        buffer = io.BytesIO()
        self.download_stream(uri, buffer)
        return buffer.getvalue()

    # -- streams and files ----------------------------------------------------------------------------

    def upload_stream(self, stream: BinaryIO, uri: str, length: int | None = None) -> None:
        bucket, key = self._bucket_key(uri)
        part_size = int(self._config.part_size)
        if length is not None:
            # S3 allows 10,000 parts: grow the part for objects that would need more.
            part_size = max(part_size, -(-length // _MAX_PARTS))
        with self._errors(uri):
            try:
                self._client.put_object(
                    bucket,
                    key,
                    stream,
                    -1 if length is None else length,
                    part_size=part_size,
                    num_parallel_uploads=self._config.parallel_uploads,
                )
            except ValueError as exc:  # e.g. more than 10,000 parts of part_size
                raise StorageError(uri, f"cannot upload: {exc}") from exc
            except OSError as exc:  # the client's "stream having not enough data"
                raise StorageError(uri, f"cannot upload: {exc}") from exc

    def download_stream(self, uri: str, stream: BinaryIO) -> int:
        bucket, key = self._bucket_key(uri)
        written = 0
        with self._errors(uri):
            response = self._client.get_object(bucket, key)
            try:
                # decode_content=False: store and return the exact bytes, even for gzip-encoded objects.
                for data in response.stream(self._config.chunk_size, decode_content=False):
                    stream.write(data)
                    written += len(data)
            finally:
                response.close()
                response.release_conn()
        return written

    def download_file(self, uri: str, path: PathLike) -> None:
        self._bucket_key(uri)  # a bad URI fails before a partial file is created
        with os_errors(str(path)), atomic_writer(Path(path)) as out:
            self.download_stream(uri, out)

    # -- metadata -------------------------------------------------------------------------------------

    def list_objects(self, uri: str) -> Iterator[ObjectInfo]:
        bucket, prefix = self._bucket_key(uri, object_required=False)
        with self._errors(uri):
            for item in self._client.list_objects(bucket, prefix=prefix or None, recursive=True):
                if item.object_name is None or item.is_dir:
                    continue
                item_uri = f"s3://{bucket}/{item.object_name}"
                yield ObjectInfo(item_uri, item.size or 0, item.last_modified, item.etag)

    def stat(self, uri: str) -> ObjectInfo:
        bucket, key = self._bucket_key(uri)
        try:
            with self._errors(uri):
                item = self._client.stat_object(bucket, key)
        except (ObjectNotFoundError, AccessDeniedError) as exc:
            raise self._explain_head_error(uri, bucket, key, exc) from exc
        return ObjectInfo(uri, item.size or 0, item.last_modified, item.etag)

    def exists(self, uri: str) -> bool:
        try:
            self.stat(uri)
        except ObjectNotFoundError:
            return False
        return True

    def delete(self, uri: str) -> None:
        bucket, key = self._bucket_key(uri)
        with self._errors(uri):
            self._client.remove_object(bucket, key)

    def ensure_bucket(self, uri: str) -> bool:
        """Create the bucket of `uri` unless it exists; True when it was created. The embedded
        deployment's MinIO starts empty, so `--local` runs create their artifact bucket."""
        bucket, _ = self._bucket_key(uri, object_required=False)
        with self._errors(uri):
            if self._client.bucket_exists(bucket):
                return False
            try:
                self._client.make_bucket(bucket, location=self._config.region)
            except S3Error as exc:
                if exc.code == "BucketAlreadyOwnedByYou":
                    return False  # created concurrently by another process
                raise
        return True
