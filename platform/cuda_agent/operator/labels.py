"""Label and annotation keys the operator puts on its children, and the children's names.

Every child carries the managed-by label, so the operator watches only its own objects (a server-side
label selector), and one owner label that maps any child event back to the object to reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP = "cuda-agent.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
POOL_KIND = "SandboxPool"
POOL_PLURAL = "sandboxpools"
RUN_KIND = "TrainingRun"
RUN_PLURAL = "trainingruns"

FIELD_MANAGER = "cuda-agent-operator"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "cuda-agent-operator"
NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"

# Owner labels: the value is the owning SandboxPool / TrainingRun name in the child's namespace.
POOL_LABEL = "cuda-agent.io/sandbox-pool"
RUN_LABEL = "cuda-agent.io/training-run"
# Put on trainer pods (Ray head, workers, driver) so the pool's NetworkPolicy admits exactly them.
SANDBOX_CLIENT_LABEL = "cuda-agent.io/sandbox-client-of"
# The operator's own pods carry this name label; pools admit it on the status port for the autoscaler.
OPERATOR_NAME = "cuda-agent-operator"

# Hash of the desired manifest, so an unchanged child is not re-applied on every pass (API writes).
SPEC_HASH = "cuda-agent.io/spec-hash"
# Set on a sandbox pod chosen for removal; the server stops taking new sessions (downward API file).
DRAIN_SINCE = "cuda-agent.io/drain-since"
# Set on a TrainingRun when the operator first sees `spec.suspend: true` (used for the checkpoint wait).
SUSPEND_REQUESTED_AT = "cuda-agent.io/suspend-requested-at"

COMPONENT_SANDBOX = "sandbox"
COMPONENT_RAY_HEAD = "ray-head"
COMPONENT_RAY_WORKER = "ray-worker"
COMPONENT_DRIVER = "trainer-driver"


def child_labels(owner_label: str, owner: str, component: str) -> dict[str, str]:
    """Labels every child of `owner` carries; `owner_label` is POOL_LABEL or RUN_LABEL."""
    return {
        MANAGED_BY: MANAGED_BY_VALUE,
        PART_OF: "cuda-agent",
        INSTANCE: owner,
        COMPONENT: component,
        owner_label: owner,
    }


def pool_selector(pool: str) -> dict[str, str]:
    """The label selector of a pool's sandbox pods (also `status.selector` for /scale and HPAs)."""
    return {POOL_LABEL: pool, COMPONENT: COMPONENT_SANDBOX}


def selector_string(selector: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def owner_of(labels: Mapping[str, str] | None) -> tuple[str, str] | None:
    """(kind, name) of the object that owns a child with these labels, or None for a stranger."""
    if not labels or labels.get(MANAGED_BY) != MANAGED_BY_VALUE:
        return None
    if POOL_LABEL in labels:
        return POOL_KIND, labels[POOL_LABEL]
    if RUN_LABEL in labels:
        return RUN_KIND, labels[RUN_LABEL]
    return None


def pool_service_host(pool: str, namespace: str) -> str:
    """DNS name of the pool's headless Service; pod `i` is `<pool>-<i>.<this>`."""
    return f"{pool}.{namespace}.svc"


def judge_configmap_name(pool: str) -> str:
    return f"{pool}-judge"


def ray_head_name(run: str) -> str:
    return f"{run}-ray-head"


def ray_worker_name(run: str, index: int) -> str:
    return f"{run}-ray-worker-{index}"


def driver_name(run: str) -> str:
    return f"{run}-driver"


def trainer_account_name(run: str) -> str:
    return f"{run}-trainer"


def run_config_name(run: str) -> str:
    return f"{run}-config"
