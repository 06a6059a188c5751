"""Writing desired children: server-side apply, skipped when the child already carries the same hash.

Shared by the pool and run reconcilers (they are siblings; neither imports the other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cuda_agent.operator import labels as lb
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.kube import KubeError, Manifest
from cuda_agent.operator.views import ChildView

UNWATCHED = ("PodGroup",)  # children of optional APIs the operator writes but does not watch


async def apply_changed(
    context: OperatorContext, manifests: Sequence[Manifest], live: Mapping[tuple[str, str], ChildView]
) -> tuple[list[str], list[str]]:
    """Server-side apply every manifest whose child is missing or carries another hash.

    Returns (names applied, errors as text). A child applied by this process a moment ago may not be
    in the watch index yet; the in-memory record of applied hashes keeps that from a second write.
    """
    applied: list[str] = []
    errors: list[str] = []
    for manifest in manifests:
        meta = manifest["metadata"]
        wanted = meta["annotations"][lb.SPEC_HASH]
        key = (manifest["kind"], meta["namespace"], meta["name"])
        child = live.get((manifest["kind"], meta["name"]))
        if child is not None and wanted in (child.spec_hash, context.applied.get(key)):
            continue
        if manifest["kind"] in UNWATCHED and context.applied.get(key) == wanted:
            continue  # not in any watch index: this process's own record is all there is
        try:
            await context.kube.apply(manifest)
        except KubeError as error:
            errors.append(f"{manifest['kind']} {meta['name']}: {error}")
            continue
        context.applied[key] = wanted
        applied.append(meta["name"])
    return applied, errors
