"""The autoscaler end to end: demand served over HTTP in the sandbox server's `/v1/status` schema drives
spec.replicas through /scale, with Events, a scale-down delay and a drain that waits for live sessions.

The sandbox pods under kwok run no server, so each pod's load is served by a minimal real HTTP server on
127.0.0.1 (the same JSON fields the sandbox server returns), named to the operator by its endpoint map.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from operator_harness import Namespace, OperatorProcess, pool_manifest, wait_for

POOL = "pool"


class StatusServers:
    """One loopback HTTP server per sandbox pod, answering GET /v1/status with a load the test sets."""

    def __init__(self, pods: list[str]) -> None:
        self.loads = {pod: (0, 0) for pod in pods}
        self.servers: dict[str, ThreadingHTTPServer] = {}
        for pod in pods:
            self.servers[pod] = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(pod))
            threading.Thread(target=self.servers[pod].serve_forever, daemon=True).start()

    def _handler(self, pod: str) -> type[BaseHTTPRequestHandler]:
        loads = self.loads

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/v1/status":
                    self.send_error(404)
                    return
                active, queued = loads[pod]
                body = json.dumps({"activeSessions": active, "queuedJudgeJobs": queued}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler

    def urls(self) -> dict[str, str]:
        return {pod: f"http://127.0.0.1:{server.server_address[1]}" for pod, server in self.servers.items()}

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture
def status_servers() -> Iterator[StatusServers]:
    servers = StatusServers([f"{POOL}-{i}" for i in range(4)])
    yield servers
    servers.close()


def test_demand_scales_up_at_once_down_after_the_delay_and_drains_busy_pods(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], status_servers: StatusServers
) -> None:
    operator = operator_factory("--drain-grace-period", "600")
    operator.set_endpoints(status_servers.urls())
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetSessionsPerReplica": 2,
        "scaleDownDelaySeconds": 3,
    }
    namespace.apply(pool_manifest(POOL, 1, autoscaling=autoscaling))

    def pods() -> list[dict[str, object]]:
        found = namespace.items("pods", "-l", f"cuda-agent.io/sandbox-pool={POOL}")
        return [p for p in found if not p["metadata"].get("deletionTimestamp")]

    def status() -> dict[str, object]:
        return dict(namespace.get("sandboxpool", POOL).get("status") or {})

    wait_for(lambda: status().get("readyReplicas") == 1, "the first sandbox pod")

    # 5 open sessions + 2 queued judge jobs at 2 per replica: 4 replicas, at once.
    status_servers.loads[f"{POOL}-0"] = (5, 2)
    wait_for(lambda: namespace.get("sandboxpool", POOL)["spec"]["replicas"] == 4, "scale-up to 4")
    wait_for(lambda: status().get("readyReplicas") == 4, "4 ready pods")
    wait_for(
        lambda: status().get("activeSessions") == 5 and status().get("queueDepth") == 2, "demand in status"
    )
    up = namespace.events("ScaledUp")
    assert len(up) == 1 and "1 -> 4 replicas" in up[0]["message"]

    # Demand falls to one session, on the highest pod: after the delay the pool goes to 1, but the
    # StatefulSet keeps pod 3 (and so the pods below it) until that session ends.
    status_servers.loads[f"{POOL}-0"] = (0, 0)
    status_servers.loads[f"{POOL}-3"] = (1, 0)
    wait_for(lambda: namespace.get("sandboxpool", POOL)["spec"]["replicas"] == 1, "scale-down decision")
    scaling = wait_for(
        lambda: (
            (c := namespace.condition(f"sandboxpool/{POOL}", "Scaling")) and c["reason"] == "Draining" and c
        ),
        "Draining condition",
    )
    assert f"{POOL}-3" in scaling["message"]
    draining = namespace.get("pod", f"{POOL}-3")["metadata"]["annotations"]
    assert "cuda-agent.io/drain-since" in draining
    assert len(pods()) == 4 and namespace.get("statefulset", POOL)["spec"]["replicas"] == 4

    status_servers.loads[f"{POOL}-3"] = (0, 0)
    wait_for(lambda: len(pods()) == 1, "the drained pods to go")
    wait_for(lambda: status().get("readyReplicas") == 1, "1 ready pod")
    down = namespace.events("ScaledDown")
    assert len(down) == 1 and "4 -> 1 replicas" in down[0]["message"]
    assert len(namespace.events("ScaledUp")) == 1  # no flapping
