"""SandboxPool: GPU pods that run agent sessions and judge kernels, sized by hand or by queue depth.

A pool is the reward service: TrainingRuns (or any RL framework) open sessions on it. Its spec says what
each sandbox pod gets (GPU, image, seccomp, limits) and how many of them exist; `/scale` lets `kubectl
scale` and autoscalers set that number.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt

from cuda_agent.api.base import (
    DNS_SUBDOMAIN,
    MAX_IMAGE,
    MAX_NAME,
    QUANTITY,
    ApiModel,
    CelRule,
    Condition,
    CustomResource,
    PrinterColumn,
    ScaleSubresource,
    conditions_field,
    immutable,
    object_name_rule,
    section,
)

# Extended resource name as the device plugin advertises it ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb").
_EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# Label value (the product name goes into a node selector).
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_DOT_DOT = re.compile(r"(^|/)\.\.(/|$)")
# An image reference as the distribution grammar spells it: [registry[:port]/]path[:tag][@digest].
_HOST_PART = r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
_DOMAIN = rf"(localhost|{_HOST_PART}(\.{_HOST_PART})+)(:[0-9]{{1,5}})?"
_PATH = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    rf"^({_DOMAIN}/)?{_PATH}(/{_PATH})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
# The pool names its StatefulSet and headless Service: a Service name is a DNS-1035 label, and each pod
# gets a `controller-revision-hash: <name>-<10 characters>` label, which must fit a label's 63.
MAX_POOL_NAME = 52

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def mebibytes(quantity: str) -> int:
    """A Kubernetes quantity ("10Gi", "500M", "1000000") in MiB, rounded up."""
    number = quantity.rstrip("KMGTPik")
    return -(-int(float(number) * _UNITS[quantity[len(number) :]]) // 2**20)


def _quantity_between(field_name: str, low: str, high: str) -> CelRule:
    """A size within [low, high], at admission (CEL's quantity library) and in Python."""
    low_mib, high_mib = mebibytes(low), mebibytes(high)
    return CelRule(
        f"!isQuantity(self) || (quantity(self).compareTo(quantity('{low}')) >= 0"
        f" && quantity(self).compareTo(quantity('{high}')) <= 0)",
        f"{field_name} must be between {low} and {high}",
        check=lambda q: re.fullmatch(QUANTITY, q) is None or low_mib <= mebibytes(q) <= high_mib,
    )


class SandboxPoolConditionType(StrEnum):
    """The condition types the operator writes on a SandboxPool."""

    READY = "Ready"
    SCALING = "Scaling"
    DEGRADED = "Degraded"
    LOAD_REPORTED = "LoadReported"  # the pods answered GET /v1/status (Unknown: nobody asked or answered)


class SeccompProfileType(StrEnum):
    RUNTIME_DEFAULT = "RuntimeDefault"
    LOCALHOST = "Localhost"


class UserNamespaces(StrEnum):
    """Whether the sandbox pods run in a user namespace of their own, so the server can give every agent
    command its own PID, IPC, mount and network namespaces (docs/sandbox.md, "restricted mode")."""

    DISABLED = "Disabled"
    REQUIRED = "Required"


# The profile the Helm chart installs beside sandbox.json for userNamespaces: Required (the base profile
# plus unshare of the five namespaces the launcher creates, and mount with the flags it uses).
USERNS_PROFILE_NAME = "sandbox-userns.json"


class Autoscaling(ApiModel):
    """Queue-depth autoscaling: the operator sets spec.replicas to keep sessions per replica near the
    target, within [minReplicas, maxReplicas]."""

    cel_rules = (
        CelRule(
            "self.minReplicas <= self.maxReplicas",
            "spec.autoscaling.minReplicas must be less than or equal to spec.autoscaling.maxReplicas",
            field_path=".minReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
        ),
    )

    min_replicas: StrictInt = Field(
        default=1, ge=0, le=1024, description="Fewest replicas, also when the queue is empty."
    )
    max_replicas: StrictInt = Field(default=8, ge=1, le=1024, description="Most replicas.")
    target_sessions_per_replica: StrictInt = Field(
        default=4, ge=1, le=1024, description="Open plus queued sessions per replica the autoscaler aims for."
    )
    scale_down_delay_seconds: StrictInt = Field(
        default=300, ge=0, le=86_400, description="How long demand must stay low before replicas are removed."
    )


class GpuSpec(ApiModel):
    """The GPU each sandbox pod gets."""

    cel_rules = (
        CelRule(
            "self.count > 0 || !has(self.product)",
            "spec.gpu.product must be unset when spec.gpu.count is 0 (a CPU-only pool is placed on any node)",
            field_path=".product",
            reason="FieldValueForbidden",
            check=lambda g: g.count > 0 or g.product is None,
        ),
    )

    resource_name: Annotated[
        str,
        Field(max_length=MAX_NAME, pattern=_EXTENDED_RESOURCE),
        immutable("spec.gpu.resourceName", "timings from different GPU kinds do not mix; create a new pool"),
    ] = Field(
        default="nvidia.com/gpu", description="Extended resource requested per pod, e.g. nvidia.com/gpu."
    )
    count: StrictInt = Field(default=1, ge=0, le=16, description="GPUs per pod; 0 runs CPU-only sandboxes.")
    product: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=_LABEL_VALUE,
        description="Required value of the node label nvidia.com/gpu.product (e.g. NVIDIA-H200), so all "
        "timings of a pool come from one GPU model.",
    )


class SeccompProfile(ApiModel):
    """Seccomp profile of the sandbox containers."""

    cel_rules = (
        CelRule(
            "self.type != 'Localhost' || has(self.localhostProfile)",
            "spec.security.seccompProfile.localhostProfile is required when type is Localhost",
            field_path=".localhostProfile",
            reason="FieldValueRequired",
            check=lambda p: p.type != SeccompProfileType.LOCALHOST or p.localhost_profile is not None,
        ),
        CelRule(
            "self.type == 'Localhost' || !has(self.localhostProfile)",
            "spec.security.seccompProfile.localhostProfile must be unset unless type is Localhost",
            field_path=".localhostProfile",
            reason="FieldValueForbidden",
            check=lambda p: p.type == SeccompProfileType.LOCALHOST or p.localhost_profile is None,
        ),
    )

    type: SeccompProfileType = Field(
        default=SeccompProfileType.RUNTIME_DEFAULT,
        description="RuntimeDefault (the container runtime's profile) or Localhost (a profile file on the "
        "node, e.g. the stricter one the Helm chart installs).",
    )
    localhost_profile: (
        Annotated[
            str,
            Field(max_length=MAX_NAME, pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"),
            CelRule(
                r"!self.matches(r'(^|/)\.\.(/|$)')",
                "spec.security.seccompProfile.localhostProfile must not contain '..' segments",
                check=lambda path: _DOT_DOT.search(path) is None,
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Profile path relative to the kubelet's seccomp directory (type Localhost only).",
    )


class SecuritySpec(ApiModel):
    """Isolation of the sandbox pods beyond the restricted Pod Security profile, which the operator
    always applies."""

    cel_rules = (
        # RuntimeDefault profiles refuse unshare without CAP_SYS_ADMIN, which a restricted pod never has:
        # the server would refuse to start (--user-namespaces on) on every node.
        CelRule(
            "self.userNamespaces != 'Required' || self.seccompProfile.type == 'Localhost'",
            "spec.security.userNamespaces Required needs spec.security.seccompProfile type Localhost, naming "
            f"a profile that permits the sandbox's namespaces (the chart installs {USERNS_PROFILE_NAME})",
            field_path=".seccompProfile.type",
            check=lambda s: (
                s.user_namespaces != UserNamespaces.REQUIRED
                or s.seccomp_profile.type == SeccompProfileType.LOCALHOST
            ),
        ),
    )

    seccomp_profile: SeccompProfile = section(SeccompProfile, "Seccomp profile of the sandbox containers.")
    user_namespaces: UserNamespaces = Field(
        default=UserNamespaces.DISABLED,
        description="Required: the pods run with hostUsers false (their uids map to unprivileged ones on "
        "the node) and an unmasked /proc, and the server gives every agent command its own PID, IPC, "
        "mount and network namespaces, refusing to start where it cannot. Needs Kubernetes 1.35+, nodes "
        "with containerd 2.0+ or CRI-O 1.25+ and Linux 6.3+, a Localhost seccomp profile that permits the "
        f"namespaces (the chart installs {USERNS_PROFILE_NAME}), and a namespace enforcing Pod Security "
        "baseline: restricted refuses an unmasked /proc even in a user namespace, and the pods meet every "
        "other restricted rule (docs/sandbox.md). Disabled: the pods share the node's users, and the "
        "server uses such namespaces only where the profile allows them.",
    )
    runtime_class_name: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN,
        description="RuntimeClass of the pods, e.g. gvisor; the cluster default when absent.",
    )


class LimitsSpec(ApiModel):
    """Per-session limits enforced by the sandbox server."""

    build_timeout_seconds: StrictInt = Field(
        default=300,
        ge=1,
        le=3600,
        description="Wall-clock limit of one kernel build (nvcc and the C++ binding).",
    )
    run_timeout_seconds: StrictInt = Field(
        default=120,
        ge=1,
        le=3600,
        description="Wall-clock limit of one verify or profile run, and of one bash command.",
    )
    # Bounds: a pod must hold the server, a judge importing torch and an agent's build (~1-2 GiB), and
    # no node has more than a few TiB; the workspace quota maps onto SandboxServerConfig's
    # workspace_quota_mib, which accepts 16 MiB to 1 TiB.
    memory: Annotated[
        str,
        Field(max_length=32, pattern=QUANTITY),
        _quantity_between("spec.limits.memory", "2Gi", "16Ti"),
    ] = Field(default="32Gi", description="Memory limit of a sandbox pod (2Gi to 16Ti).")
    pids: StrictInt = Field(
        default=1024, ge=64, le=1_000_000, description="Most processes a session may run at once."
    )
    workspace_size: Annotated[
        str,
        Field(max_length=32, pattern=QUANTITY),
        _quantity_between("spec.limits.workspaceSize", "64Mi", "1Ti"),
    ] = Field(default="10Gi", description="Size limit of a session's workspace directory (64Mi to 1Ti).")


class TelemetrySpec(ApiModel):
    """What the sandbox pods send out. Nothing by default: the pods have no egress at all."""

    export_traces: StrictBool = Field(
        default=False,
        description="Export the sandbox server's spans (requests, judge runs with build/verify/profile) to "
        "the operator's OTLP collector, so a trace follows an episode into the pod. Opens egress to the "
        "collector's pods on its port and to cluster DNS only; needs the operator's --otel-endpoint and "
        "--otel-collector-label.",
    )


class SandboxPoolSpec(ApiModel):
    """Desired state of a SandboxPool."""

    cel_rules = (
        CelRule(
            "!has(self.autoscaling) || (self.replicas >= self.autoscaling.minReplicas"
            " && self.replicas <= self.autoscaling.maxReplicas)",
            "spec.replicas must lie within [spec.autoscaling.minReplicas, spec.autoscaling.maxReplicas]",
            field_path=".replicas",
            check=lambda s: (
                s.autoscaling is None
                or s.autoscaling.min_replicas <= s.replicas <= s.autoscaling.max_replicas
            ),
        ),
    )

    replicas: StrictInt = Field(
        default=1, ge=0, le=1024, description="Number of sandbox pods (set by /scale and the autoscaler)."
    )
    autoscaling: Autoscaling | None = Field(
        default=None, description="Queue-depth autoscaling; replicas stay as written when absent."
    )
    gpu: GpuSpec = section(GpuSpec, "GPU per pod.")
    image: str = Field(
        min_length=1,
        max_length=MAX_IMAGE,
        pattern=IMAGE_REFERENCE,
        description="Sandbox server image built from sandbox_image/, e.g. registry/cuda-agent-sandbox:0.1.0 "
        "([registry[:port]/]path[:tag][@digest]).",
    )
    security: SecuritySpec = section(SecuritySpec, "Seccomp profile, runtime class and user namespaces.")
    limits: LimitsSpec = section(LimitsSpec, "Per-session time, memory, process and disk limits.")
    telemetry: TelemetrySpec = section(TelemetrySpec, "Trace export (off: no egress at all).")


class SandboxPoolStatus(ApiModel):
    """Observed state of a SandboxPool, written by the operator."""

    observed_generation: StrictInt | None = Field(
        default=None, ge=0, description="metadata.generation last acted upon."
    )
    replicas: StrictInt | None = Field(default=None, ge=0, description="Sandbox pods that exist.")
    ready_replicas: StrictInt | None = Field(
        default=None, ge=0, description="Sandbox pods that accept sessions."
    )
    selector: str | None = Field(
        default=None, max_length=1024, description="Label selector of the pods, as a string (for /scale)."
    )
    queue_depth: StrictInt | None = Field(
        default=None, ge=0, description="Session requests waiting for a free sandbox."
    )
    active_sessions: StrictInt | None = Field(default=None, ge=0, description="Sessions open now.")
    conditions: list[Condition] = conditions_field()


class SandboxPool(CustomResource):
    """A pool of hardened GPU sandboxes that run agent sessions and judge CUDA kernels."""

    cel_rules = (
        object_name_rule(
            "SandboxPool", MAX_POOL_NAME, "it names the pool's StatefulSet, Service and their pods' labels"
        ),
    )
    plural = "sandboxpools"
    singular = "sandboxpool"
    short_names = ("sp",)
    printer_columns = (
        PrinterColumn("Ready", ".status.readyReplicas", "integer", "Pods accepting sessions."),
        PrinterColumn("Desired", ".spec.replicas", "integer", "Pods wanted."),
        PrinterColumn("Queue", ".status.queueDepth", "integer", "Session requests waiting."),
        PrinterColumn("Sessions", ".status.activeSessions", "integer", "Sessions open now."),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date", "Time since creation."),
        PrinterColumn("GPU", ".spec.gpu.resourceName", "string", "GPU resource per pod.", priority=1),
        PrinterColumn("Image", ".spec.image", "string", "Sandbox image.", priority=1),
    )
    scale = ScaleSubresource(
        spec_replicas_path=".spec.replicas",
        status_replicas_path=".status.replicas",
        label_selector_path=".status.selector",
    )

    api_version: Literal["cuda-agent.io/v1alpha1"] = Field(
        default="cuda-agent.io/v1alpha1", description="API version."
    )
    kind: Literal["SandboxPool"] = Field(default="SandboxPool", description="Kind of the object.")
    spec: SandboxPoolSpec = Field(description="Desired state.")
    status: SandboxPoolStatus | None = Field(
        default=None, description="Observed state, written by the operator."
    )
