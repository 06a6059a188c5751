"""Pieces every child manifest is built from, shared by the pool and run builders (pure: no I/O).

Kept below both `pool_children` and `run_children` (as KubeRay keeps `common/`), so the two sides are
siblings: neither imports the other.
"""

from __future__ import annotations

from typing import Any

from cuda_agent.operator import labels as lb
from cuda_agent.operator.kube import Manifest
from cuda_agent.operator.views import manifest_hash


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """Controller reference: deleting the owner lets the garbage collector delete the child."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_hash(manifest: Manifest) -> Manifest:
    """Stamp the manifest with the hash of its own content (computed before the stamp is added)."""
    stamped = dict(manifest)
    metadata = dict(stamped["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), lb.SPEC_HASH: manifest_hash(manifest)}
    stamped["metadata"] = metadata
    return stamped
