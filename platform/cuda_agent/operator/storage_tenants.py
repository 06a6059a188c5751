"""A MinIO user per namespace, allowed nothing but its namespace's prefix of the artifacts bucket.

`python -m cuda_agent.operator.storage_tenants --endpoint URL --bucket NAME --tenants FILE` with the MinIO
root credentials in MINIO_ROOT_USER / MINIO_ROOT_PASSWORD. The chart runs it as a Job (the bundled MinIO
with `artifacts.tenantCredentials`, the default) and puts each namespace's own keys into that namespace's
artifacts Secret, so a trainer (or anyone reading the Secret) can reach `s3://<bucket>/<namespace>/` and
nothing else: not another namespace's checkpoints, not the bucket's root. Idempotent: the bucket, each
policy and each user are created or updated to what FILE says ({"<namespace>": {"accessKey": ...,
"secretKey": ...}}). Where the prefix comes from: operator/tenancy.py, docs/install.md "Multi-tenancy".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.telemetry.config import TelemetryConfig
from cuda_agent.telemetry.logs import configure_logging

log = logging.getLogger(__name__)
POLICY_PREFIX = "cuda-agent-tenant-"
OBJECT_ACTIONS = [
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
]


def policy_name(namespace: str) -> str:
    return f"{POLICY_PREFIX}{namespace}"


def tenant_policy(bucket: str, namespace: str) -> dict[str, Any]:
    """Read, write, delete and list under `<bucket>/<namespace>/` only (the bucket's region too, which
    the storage client asks for once)."""
    bucket_arn = f"arn:aws:s3:::{bucket}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [bucket_arn]},
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{namespace}/*"]}},
            },
            {"Effect": "Allow", "Action": OBJECT_ACTIONS, "Resource": [f"{bucket_arn}/{namespace}/*"]},
        ],
    }


def read_tenants(path: Path) -> dict[str, tuple[str, str]]:
    """namespace -> (access key, secret key), checked: a namespace is a DNS label, keys MinIO accepts."""
    document = json.loads(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected an object of namespaces")
    tenants: dict[str, tuple[str, str]] = {}
    for namespace, keys in document.items():
        access, secret = (keys or {}).get("accessKey"), (keys or {}).get("secretKey")
        if not (
            isinstance(namespace, str) and 0 < len(namespace) <= 63 and namespace.replace("-", "").isalnum()
        ):
            raise ValueError(f"{path}: {namespace!r} is not a namespace name")
        if not (isinstance(access, str) and 3 <= len(access) <= 128 and access.isprintable()):
            raise ValueError(f"{path}: {namespace}: accessKey must be 3-128 printable characters")
        if not (isinstance(secret, str) and 8 <= len(secret) <= 128 and secret.isprintable()):
            raise ValueError(f"{path}: {namespace}: secretKey must be 8-128 printable characters")
        tenants[namespace] = (access, secret)
    return tenants


def apply_tenants(
    endpoint: str, root_user: str, root_password: str, bucket: str, tenants: Mapping[str, tuple[str, str]]
) -> None:
    """Create or update the bucket, and per namespace its policy and its user with that policy."""
    from minio import Minio, MinioAdmin
    from minio.credentials.providers import StaticProvider

    secure = endpoint.startswith("https://")
    host = endpoint.split("://", 1)[-1].rstrip("/")
    client = Minio(host, root_user, root_password, secure=secure)
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
        log.info("created bucket %s", bucket)
    admin = MinioAdmin(endpoint=host, credentials=StaticProvider(root_user, root_password), secure=secure)
    for namespace, (access, secret) in sorted(tenants.items()):
        admin.policy_add(policy_name(namespace), policy=tenant_policy(bucket, namespace))
        admin.user_add(access, secret)
        admin.policy_set(policy_name(namespace), user=access)
        log.info("namespace %s: user %s may use s3://%s/%s/ only", namespace, access, bucket, namespace)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuda_agent.operator.storage_tenants", description=__doc__
    )
    parser.add_argument("--endpoint", required=True, help="http(s)://host:port of MinIO's S3 API")
    parser.add_argument("--bucket", required=True, help="the artifacts bucket")
    parser.add_argument("--tenants", type=Path, required=True, help='JSON {"ns": {"accessKey", "secretKey"}}')
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for MinIO to answer")
    args = parser.parse_args(list(argv))
    # JSON lines like every other process of the platform (CUDA_AGENT_LOG_FORMAT=text for plain ones).
    telemetry = TelemetryConfig.from_env(service_name="cuda-agent-storage-tenants")
    configure_logging(telemetry.log_level, telemetry.log_format)
    root_user, root_password = os.environ.get("MINIO_ROOT_USER"), os.environ.get("MINIO_ROOT_PASSWORD")
    if not root_user or not root_password:
        parser.error("MINIO_ROOT_USER and MINIO_ROOT_PASSWORD must be set")
    tenants = read_tenants(args.tenants)
    deadline = time.monotonic() + args.wait
    while True:  # the Job may start before MinIO is ready
        try:
            apply_tenants(args.endpoint, root_user, root_password, args.bucket, tenants)
            return 0
        except Exception as error:  # connection refused, 503 while MinIO starts
            if time.monotonic() > deadline:
                log.error("MinIO at %s: %s", args.endpoint, error)
                return 1
            log.warning("MinIO at %s not ready (%s); retrying", args.endpoint, error)
            time.sleep(3)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
