"""The children of a SandboxPool, built as plain manifests from its spec (pure: no I/O).

The sandbox workload is a StatefulSet, not a Deployment: a session lives in one pod's workspace for the
whole episode, so the trainer must reach the same pod on every turn. A StatefulSet gives each pod a
stable DNS name behind the headless Service (`<pool>-<i>.<pool>.<ns>.svc`) to pin a session to, and it
removes pods highest-ordinal-first, so the operator knows which pods a scale-down will remove and can
drain exactly those first. `Parallel` pod management starts and stops pods together, as a Deployment does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from cuda_agent.api.pool_server import (
    JUDGE_DIR,
    STATE_DIR,
    max_sessions,
    server_config,
    user_namespaced,
)
from cuda_agent.api.sandbox import SANDBOX_METRICS_PORT, SANDBOX_PORT
from cuda_agent.api.sandboxpool import SandboxPoolSpec, SeccompProfileType, mebibytes
from cuda_agent.operator import labels as lb
from cuda_agent.operator.kube import Manifest
from cuda_agent.operator.manifests import owner_reference, with_hash

SANDBOX_UID = 65532  # the image's unprivileged user; restricted Pod Security forbids root
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
SERVER_CONFIG_DIR = "/etc/cuda-agent/sandbox"
SERVER_CONFIG_KEY = "sandbox.yaml"
# Pod-level grace after SIGTERM: the server finishes the judge job in flight (build plus run) and exits.
TERMINATION_MARGIN_SECONDS = 30


@dataclass(frozen=True)
class PoolIdentity:
    name: str
    namespace: str
    uid: str


def _metadata(pool: PoolIdentity, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pool.namespace,
        "labels": lb.child_labels(lb.POOL_LABEL, pool.name, component),
        "ownerReferences": [owner_reference(lb.API_VERSION, lb.POOL_KIND, pool.name, pool.uid)],
    }


def judge_configmap(pool: PoolIdentity, spec: SandboxPoolSpec, judge_files: Mapping[str, str]) -> Manifest:
    """Judge scripts, mounted read-only into every sandbox pod, with their SHA-256 manifest so the
    server can refuse to judge with files that differ from what the operator shipped; and the server's
    config file (mounted elsewhere, so the judge directory holds judge files only)."""
    data = {_configmap_key(path): content for path, content in sorted(judge_files.items())}
    digest_lines = [
        f"{hashlib.sha256(content.encode()).hexdigest()}  {path}"
        for path, content in sorted(judge_files.items())
    ]
    data["MANIFEST.sha256"] = "\n".join(digest_lines) + "\n"
    data[SERVER_CONFIG_KEY] = yaml.safe_dump(server_config(spec), sort_keys=False)
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(pool, lb.judge_configmap_name(pool.name), lb.COMPONENT_SANDBOX),
            "immutable": False,
            "data": data,
        }
    )


def _configmap_key(path: str) -> str:
    # ConfigMap keys cannot hold "/": nested files are flattened and put back in place by volume items.
    return path.replace("/", "__")


def headless_service(pool: PoolIdentity) -> Manifest:
    """Session routing: the name resolves to the ready sandbox pods, and each pod has its own name."""
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(pool, pool.name, lb.COMPONENT_SANDBOX),
            "spec": {
                "clusterIP": "None",
                "selector": lb.pool_selector(pool.name),
                "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": "http", "protocol": "TCP"}],
                "publishNotReadyAddresses": False,
            },
        }
    )


@dataclass(frozen=True)
class TraceExport:
    """Where a pool exporting traces sends them: the OTLP endpoint and its collector's pod labels."""

    endpoint: str
    collector_labels: tuple[tuple[str, str], ...]

    @property
    def port(self) -> int:
        parsed = urlsplit(self.endpoint)
        return parsed.port or (443 if parsed.scheme == "https" else 4318)


def trace_export(
    spec: SandboxPoolSpec, endpoint: str | None, collector_labels: tuple[tuple[str, str], ...]
) -> TraceExport | None:
    """The pool's trace export, or None: it takes the pool asking for it and an operator that knows both
    the endpoint and the collector's pods (egress is opened to those pods, never to a whole network)."""
    if not spec.telemetry.export_traces or not endpoint or not collector_labels:
        return None
    return TraceExport(endpoint, collector_labels)


def _trace_egress(export: TraceExport) -> list[dict[str, Any]]:
    """To the collector's pods on the endpoint's port, and to cluster DNS to find them by name."""
    dns_ports = [{"protocol": protocol, "port": 53} for protocol in ("UDP", "TCP")]
    return [
        {
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(export.collector_labels)}}],
            "ports": [{"protocol": "TCP", "port": export.port}],
        },
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": dns_ports,
        },
    ]


def network_policy(
    pool: PoolIdentity,
    export: TraceExport | None = None,
    scraper_labels: tuple[tuple[str, str], ...] = (),
) -> Manifest:
    """Default deny: no egress (agent code must not reach anything; a pool exporting traces reaches its
    collector and DNS only), ingress only on the server port from the trainer pods of runs that use this
    pool and from the operator (which reads load), and, when the operator knows Prometheus's pod labels,
    from those pods on the metrics-only port."""
    scrapers = {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(scraper_labels)}}
    scrape = {"from": [scrapers], "ports": [{"protocol": "TCP", "port": SANDBOX_METRICS_PORT}]}
    return with_hash(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(pool, pool.name, lb.COMPONENT_SANDBOX),
            "spec": {
                "podSelector": {"matchLabels": lb.pool_selector(pool.name)},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [
                    {
                        "from": [
                            {"podSelector": {"matchLabels": {lb.SANDBOX_CLIENT_LABEL: pool.name}}},
                            {
                                "namespaceSelector": {},
                                "podSelector": {"matchLabels": {lb.NAME: lb.OPERATOR_NAME}},
                            },
                        ],
                        "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}],
                    },
                    *([scrape] if scraper_labels else []),
                ],
                "egress": _trace_egress(export) if export is not None else [],
            },
        }
    )


def _seccomp(spec: SandboxPoolSpec) -> dict[str, str]:
    profile = spec.security.seccomp_profile
    if profile.type == SeccompProfileType.LOCALHOST and profile.localhost_profile:
        return {"type": "Localhost", "localhostProfile": profile.localhost_profile}
    return {"type": "RuntimeDefault"}


def _proc_mount(spec: SandboxPoolSpec) -> dict[str, str]:
    """The runtime masks parts of a container's /proc, and the kernel refuses a new proc mount (the PID
    namespace's own /proc the launcher mounts) wherever /proc is partly covered. Unmasked is valid only
    with hostUsers false, where the pod's user namespace keeps it from reaching the node's /proc files."""
    return {"procMount": "Unmasked"} if user_namespaced(spec) else {}


def _state_size(spec: SandboxPoolSpec) -> str:
    """Every session's workspace quota, plus 2 GiB of build caches."""
    return f"{mebibytes(spec.limits.workspace_size) * max_sessions(spec) + 2048}Mi"


def _resources(spec: SandboxPoolSpec) -> dict[str, dict[str, str]]:
    storage = f"{mebibytes(_state_size(spec)) + 1024}Mi"  # the state volume plus /tmp
    limits = {"memory": spec.limits.memory, "ephemeral-storage": storage}
    requests = {"cpu": "1", "memory": spec.limits.memory}
    if spec.gpu.count > 0:
        # Extended resources cannot be overcommitted: request and limit must be equal.
        limits[spec.gpu.resource_name] = str(spec.gpu.count)
        requests[spec.gpu.resource_name] = str(spec.gpu.count)
    return {"requests": requests, "limits": limits}


def _volumes(pool: PoolIdentity, spec: SandboxPoolSpec, judge_paths: list[str]) -> list[dict[str, Any]]:
    configmap = lb.judge_configmap_name(pool.name)
    judge_items = [{"key": _configmap_key(p), "path": p} for p in [*judge_paths, "MANIFEST.sha256"]]
    return [
        {"name": "state", "emptyDir": {"sizeLimit": _state_size(spec)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "judge", "configMap": {"name": configmap, "defaultMode": 0o444, "items": judge_items}},
        {
            "name": "server-config",
            "configMap": {
                "name": configmap,
                "defaultMode": 0o444,
                "items": [{"key": SERVER_CONFIG_KEY, "path": SERVER_CONFIG_KEY}],
            },
        },
    ]


def _trace_env(pool: PoolIdentity, export: TraceExport) -> list[dict[str, Any]]:
    """The OpenTelemetry variables the server's telemetry setup reads (cuda_agent.telemetry.config)."""
    field = {"metadata.name": "POD_NAME", "metadata.namespace": "POD_NAMESPACE"}
    return [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": export.endpoint},
        {"name": "OTEL_SERVICE_NAME", "value": "cuda-agent-sandbox"},
        {"name": "CUDA_AGENT_POOL_NAME", "value": pool.name},
        *({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for path, name in field.items()),
    ]


def _container(spec: SandboxPoolSpec) -> dict[str, Any]:
    readiness = {"httpGet": {"path": "/v1/status", "port": "http"}, "timeoutSeconds": 2}
    liveness = {"httpGet": {"path": "/healthz", "port": "http"}, "timeoutSeconds": 2}
    return {
        "name": "sandbox",
        "image": spec.image,
        "command": ["cuda-agent", "sandbox", "serve", "--config", f"{SERVER_CONFIG_DIR}/{SERVER_CONFIG_KEY}"],
        "ports": [
            {"name": "http", "containerPort": SANDBOX_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": SANDBOX_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(spec),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "seccompProfile": _seccomp(spec),
            **_proc_mount(spec),
        },
        "volumeMounts": [
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "judge", "mountPath": JUDGE_DIR, "readOnly": True},
            {"name": "server-config", "mountPath": SERVER_CONFIG_DIR, "readOnly": True},
        ],
        "readinessProbe": {**readiness, "periodSeconds": 5, "failureThreshold": 2},
        # /healthz turns 503 once a judge file's hash changed: the kubelet restarts the pod.
        "livenessProbe": {**liveness, "periodSeconds": 20, "failureThreshold": 3, "initialDelaySeconds": 10},
    }


def statefulset(
    pool: PoolIdentity,
    spec: SandboxPoolSpec,
    replicas: int,
    judge_paths: list[str],
    judge_hash: str,
    export: TraceExport | None = None,
) -> Manifest:
    """The sandbox pods. `replicas` is what the drain plan allows now, not always spec.replicas."""
    selector = lb.pool_selector(pool.name)
    pod_labels = {**lb.child_labels(lb.POOL_LABEL, pool.name, lb.COMPONENT_SANDBOX), **selector}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # agent code must not reach the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "fsGroup": SANDBOX_UID,
            "seccompProfile": _seccomp(spec),
        },
        "terminationGracePeriodSeconds": spec.limits.build_timeout_seconds
        + spec.limits.run_timeout_seconds
        + TERMINATION_MARGIN_SECONDS,
        "containers": [_container(spec)],
        "volumes": _volumes(pool, spec, judge_paths),
    }
    if export is not None:
        pod_spec["containers"][0]["env"] = _trace_env(pool, export)
    if spec.gpu.count > 0:
        pod_spec["tolerations"] = [
            {"key": spec.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if spec.gpu.product:
        pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: spec.gpu.product}
    if spec.security.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.security.runtime_class_name
    if user_namespaced(spec):
        pod_spec["hostUsers"] = False  # uid 65532 inside maps to an unprivileged uid range on the node
    return with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _metadata(pool, pool.name, lb.COMPONENT_SANDBOX),
            "spec": {
                "replicas": replicas,
                "serviceName": pool.name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": selector},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    # The judge hash rolls the pods when the judge files change (mounted files would
                    # update in place, under sessions that already started with the old judge).
                    "metadata": {
                        "labels": pod_labels,
                        "annotations": {"cuda-agent.io/judge-hash": judge_hash},
                    },
                    "spec": pod_spec,
                },
            },
        }
    )
