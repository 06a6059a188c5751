"""Reads each sandbox pod's load from the server's `GET /v1/status` (`activeSessions`, `queuedJudgeJobs`).

A pod is asked at `http://<podIP>:<port>/v1/status` unless an endpoint map names another address for it
(a local cluster whose pod IPs are not routable from the operator). Pod IPs outside the allowed networks
are never contacted: such a pod counts as silent, which the autoscaler treats pessimistically.

Each probe is a CLIENT span (OpenTelemetry's aiohttp client instrumentation) under the pool's reconcile
span, so a slow pod shows in the pass's trace; the server does not trace /v1/status itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from cuda_agent.operator.autoscaler import PodLoad
from cuda_agent.operator.views import PodView
from cuda_agent.telemetry.tracing import http_client_trace_configs

log = logging.getLogger(__name__)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ProbeSettings:
    """`endpoint_map` is a JSON file {"namespace/pod": "http://host:port"}, re-read on every probe."""

    allowed_networks: tuple[Network, ...] = (
        ipaddress.ip_network("0.0.0.0/0"),
        ipaddress.ip_network("::/0"),
    )
    endpoint_map: Path | None = None
    timeout: float = 2.0
    concurrency: int = 32


def read_endpoint_map(path: Path | None) -> dict[str, str]:
    if path is None or not path.exists():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path}: endpoint map is not JSON: {error}") from error
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ValueError(f'{path}: endpoint map must be an object {{"namespace/pod": "http://host:port"}}')
    return {str(k): v.rstrip("/") for k, v in loaded.items()}


def endpoint_for(
    namespace: str, pod: PodView, port: int, endpoints: Mapping[str, str], allowed: Sequence[Network]
) -> str | None:
    """Base URL of a pod's server, or None when it must not (or cannot) be contacted."""
    mapped = endpoints.get(f"{namespace}/{pod.name}")
    if mapped is not None:
        return mapped
    if pod.ip is None:
        return None
    address = ipaddress.ip_address(pod.ip)
    if not any(address in network for network in allowed):
        return None
    host = f"[{pod.ip}]" if address.version == 6 else pod.ip
    return f"http://{host}:{port}"


async def probe_pods(
    namespace: str, pods: Sequence[PodView], port: int, settings: ProbeSettings
) -> list[PodLoad]:
    """Load of every given pod, asked concurrently; a pod that does not answer in time is silent."""
    endpoints = read_endpoint_map(settings.endpoint_map)
    limit = asyncio.Semaphore(settings.concurrency)
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=http_client_trace_configs()) as session:

        async def ask(pod: PodView) -> PodLoad:
            base = endpoint_for(namespace, pod, port, endpoints, settings.allowed_networks)
            if base is None:
                return PodLoad(pod.name, None, None)
            async with limit:
                return await _ask_one(session, pod.name, f"{base}/v1/status")

        return list(await asyncio.gather(*(ask(pod) for pod in pods)))


async def _ask_one(session: aiohttp.ClientSession, pod: str, url: str) -> PodLoad:
    try:
        async with session.get(url) as response:
            response.raise_for_status()
            body = await response.json(content_type=None)
        return PodLoad(pod, int(body["activeSessions"]), int(body["queuedJudgeJobs"]))
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as error:
        log.debug("sandbox pod %s did not report its load at %s: %s", pod, url, error)
        return PodLoad(pod, None, None)
