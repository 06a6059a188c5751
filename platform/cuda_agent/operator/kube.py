"""The one module that talks to the Kubernetes API (Kopf's own watches aside).

Children are written with server-side apply under one field manager, which makes every write
idempotent: a restarted operator re-applies the same manifests and the apiserver merges them into the
objects it already has, so nothing is duplicated and nothing is orphaned. Status and metadata use JSON
merge patches of only the fields the operator owns, so the trainer's progress fields stay untouched.

Every HTTP request the client sends (each attempt of a retried one) counts in client-go's
`rest_client_requests_total{code,method,host}` and `rest_client_request_duration_seconds{verb,host}`,
and is a CLIENT span (OpenTelemetry's aiohttp client instrumentation) under the current span, the
reconcile pass's: both through aiohttp trace configs on the client's session (Kopf's watches use a
session of their own and are neither counted nor traced).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict, Unpack

import aiohttp
from kubernetes.aio import config as aio_config
from kubernetes.aio.client import ApiClient, Configuration

from cuda_agent.operator.labels import FIELD_MANAGER
from cuda_agent.operator.metrics import rest_request_done
from cuda_agent.telemetry.tracing import http_client_trace_configs

Manifest = dict[str, Any]
log = logging.getLogger(__name__)

DISCOVERY_TTL = 30.0
LOG_TIMEOUT_SECONDS = 5.0  # a node that does not serve logs must not hold up a reconcile pass
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"

# kind -> (apiVersion, plural). A static table instead of discovery: the operator writes only these.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("v1", "configmaps"),
    "Event": ("v1", "events"),
    "Pod": ("v1", "pods"),
    "Secret": ("v1", "secrets"),
    "Service": ("v1", "services"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "Deployment": ("apps/v1", "deployments"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies"),
    "Node": ("v1", "nodes"),
    # scheduler-plugins' by default; Volcano's (scheduling.volcano.sh/v1beta1) has the same kind and
    # plural, and `apply` takes the apiVersion from the manifest.
    "PodGroup": ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
    "Role": ("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
    "RayCluster": ("ray.io/v1", "rayclusters"),
    "SandboxPool": ("cuda-agent.io/v1alpha1", "sandboxpools"),
    "TrainingRun": ("cuda-agent.io/v1alpha1", "trainingruns"),
}


class _RawOptions(TypedDict, total=False):
    """`_raw`'s keyword options that `_request` passes on (its defaults apply to those left out)."""

    body: Any
    content_type: str
    query: list[tuple[str, str]] | None
    counted: str
    accept: str
    timeout: float | None


class KubeError(RuntimeError):
    """A non-2xx answer from the apiserver, with the status code and the server's message."""

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Ref:
    """Where an object lives: enough to build its URL."""

    kind: str
    namespace: str
    name: str

    @property
    def api_version(self) -> str:
        return RESOURCES[self.kind][0]

    @property
    def plural(self) -> str:
        return RESOURCES[self.kind][1]

    @classmethod
    def of(cls, manifest: Manifest) -> Ref:
        meta = manifest["metadata"]
        return cls(kind=manifest["kind"], namespace=meta["namespace"], name=meta["name"])


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(ref: Ref, subresource: str | None = None) -> str:
    path = f"{collection_path(ref.api_version, ref.plural, ref.namespace)}/{ref.name}"
    return f"{path}/{subresource}" if subresource else path


class Kube:
    """Async access to the apiserver; counts its own writes (the scale benchmark reports them)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api
        self.writes: Counter[str] = Counter()
        self._discovery: dict[tuple[str, str], tuple[float, bool]] = {}

    @classmethod
    async def connect(cls, kubeconfig: Path | None) -> Kube:
        """Kubeconfig when given (or $KUBECONFIG / ~/.kube/config), else the pod's service account."""
        configuration = Configuration()
        if kubeconfig is None and not _kubeconfig_available():
            aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None, client_configuration=configuration
            )
        configuration.trace_configs = [rest_client_metrics(), *http_client_trace_configs()]
        return cls(ApiClient(configuration))

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def _request(self, method: str, path: str, **options: Unpack[_RawOptions]) -> Manifest | None:
        """One JSON round trip (`_raw` decoded); None on 404, KubeError on any other failure."""
        raw = await self._raw(method, path, **options)
        if raw is None:
            return None
        result: Manifest = json.loads(raw) if raw else {}
        return result

    async def _raw(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        counted: str = "",
        accept: str = "application/json",
        timeout: float | None = None,
    ) -> bytes | None:
        _, url, headers, _, _ = await self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": accept},
            auth_settings=["BearerToken"],
        )
        response = await self._api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout
        )
        raw: bytes = await response.read()  # type: ignore[no-untyped-call]
        if counted:
            self.writes[counted] += 1
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise KubeError(response.status, method, path, _server_message(raw))
        return raw

    async def get(self, ref: Ref) -> Manifest | None:
        return await self._request("GET", object_path(ref))

    async def list(
        self, api_version: str, plural: str, *, namespace: str | None = None, field_selector: str = ""
    ) -> list[Manifest]:
        """Every object of a type (cluster-wide without a namespace), e.g. nodes or running pods."""
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = collection_path(api_version, plural, namespace) if namespace else f"{prefix}/{plural}"
        query = [("fieldSelector", field_selector)] if field_selector else []
        listing = await self._request("GET", path, query=query)
        return list((listing or {}).get("items") or [])

    async def pod_log(self, namespace: str, pod: str, *, tail_lines: int, previous: bool) -> str:
        """The last lines a pod's (previous, i.e. crashed) container wrote; the kubelet serves them."""
        query = [("tailLines", str(tail_lines)), ("previous", "true" if previous else "false")]
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        try:
            # JSON too: an error (no such container, a node that serves no logs) comes back as a Status
            # object, which the apiserver refuses to send as text/plain (HTTP 406 instead of the reason).
            raw = await self._raw(
                "GET", path, query=query, accept="text/plain, application/json", timeout=LOG_TIMEOUT_SECONDS
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, "GET", path, f"{type(error).__name__}: {error}") from error
        return (raw or b"").decode(errors="replace")

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply of a whole child; `force` because these fields belong to the operator."""
        ref = Ref.of(manifest)
        collection = collection_path(manifest["apiVersion"], ref.plural, ref.namespace)
        path = f"{collection}/{ref.name}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        applied = await self._request(
            "PATCH", path, body=manifest, content_type=APPLY, query=query, counted=f"apply {manifest['kind']}"
        )
        if applied is None:
            raise KubeError(404, "PATCH", path, "namespace or resource type not found")
        return applied

    async def merge_patch(self, ref: Ref, patch: Manifest, subresource: str | None = None) -> Manifest | None:
        """JSON merge patch of the given fields only; None when the object is gone."""
        query = [("fieldManager", FIELD_MANAGER)]
        return await self._request(
            "PATCH",
            object_path(ref, subresource),
            body=patch,
            content_type=MERGE,
            query=query,
            counted=f"patch {ref.kind}/{subresource}" if subresource else f"patch {ref.kind}",
        )

    async def delete(self, ref: Ref) -> bool:
        """Delete with background propagation (owner references remove the grandchildren)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        return (
            await self._request("DELETE", object_path(ref), body=body, counted=f"delete {ref.kind}")
            is not None
        )

    async def service_account_token(self, namespace: str, account: str, seconds: int) -> str:
        """A bound token of a ServiceAccount (TokenRequest): what the kubelet mounts into a pod."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        answer = await self._request("POST", path, body=body, counted="create TokenRequest")
        token = ((answer or {}).get("status") or {}).get("token")
        if not token:
            raise KubeError(404, "POST", path, f"ServiceAccount {namespace}/{account} not found")
        return str(token)

    def server(self) -> tuple[str, str | None]:
        """(apiserver URL, CA bundle file or None) this client talks to."""
        configuration = self._api.configuration
        return str(configuration.host), configuration.ssl_ca_cert

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the apiserver serves a resource type (a CRD such as ray.io/v1 rayclusters); an answer
        is kept for DISCOVERY_TTL seconds (asked on every pass of every run)."""
        now = time.monotonic()
        cached = self._discovery.get((api_version, plural))
        if cached is not None and now - cached[0] < DISCOVERY_TTL:
            return cached[1]
        listing = await self._request("GET", f"/apis/{api_version}")
        served = any(item.get("name") == plural for item in (listing or {}).get("resources", []))
        self._discovery[(api_version, plural)] = (now, served)
        return served

    async def post_event(self, involved: Manifest, *, warning: bool, reason: str, message: str) -> None:
        """A core/v1 Event on `involved`, shown by `kubectl describe` and `kubectl get events`."""
        meta = involved["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": "Warning" if warning else "Normal",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        await self._request(
            "POST", collection_path("v1", "events", meta["namespace"]), body=event, counted="create Event"
        )


def rest_client_metrics() -> aiohttp.TraceConfig:
    """An aiohttp trace config that counts and times each request as client-go's rest client does: from
    sending it to the answer's headers (or the error), labelled with its method and the server's
    host:port."""
    config = aiohttp.TraceConfig()

    async def started(
        _: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestStartParams
    ) -> None:
        context.rest_started = time.perf_counter()

    async def answered(
        _: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        seconds = time.perf_counter() - context.rest_started
        rest_request_done(
            params.method, params.url.host_port_subcomponent or "", params.response.status, seconds
        )

    async def failed(
        _: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestExceptionParams
    ) -> None:
        seconds = time.perf_counter() - context.rest_started
        rest_request_done(params.method, params.url.host_port_subcomponent or "", None, seconds)

    config.on_request_start.append(started)
    config.on_request_end.append(answered)
    config.on_request_exception.append(failed)
    return config


def _kubeconfig_available() -> bool:
    import os

    return bool(os.environ.get("KUBECONFIG")) or (Path.home() / ".kube" / "config").exists()


def _server_message(raw: bytes) -> str:
    try:
        message = json.loads(raw).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else raw.decode(errors="replace")[:500]
