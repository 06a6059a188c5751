"""Typed storage errors. Every message starts with the URI (or path) it is about, so a failed checkpoint
upload in a trainer log says *which* object failed, not only that S3 said 404."""

from __future__ import annotations


class StorageError(Exception):
    """Base class: anything that went wrong while reading or writing an artifact."""

    def __init__(self, uri: str | None, message: str) -> None:
        self.uri = uri
        self.reason = message
        super().__init__(f"{uri}: {message}" if uri else message)


class InvalidURIError(StorageError, ValueError):
    """The URI cannot name an object: unknown scheme, bad bucket name, empty key, path escaping a mount."""


class StorageConfigError(StorageError, ValueError):
    """A configuration value (environment variable or Secret key) is missing or malformed."""


class BucketNotFoundError(StorageError):
    """The bucket (or, for `pvc://`, the mounted claim) does not exist."""


class ObjectNotFoundError(StorageError):
    """No object (file) at that key (path)."""


class AccessDeniedError(StorageError):
    """The server (or file system) refused the operation for these credentials."""


class InvalidCredentialsError(AccessDeniedError):
    """The server does not accept the credentials at all: unknown access key or wrong secret key."""


class EndpointUnreachableError(StorageError):
    """No usable connection to the S3 endpoint: nothing listening, timeout, TLS failure, connection lost."""
