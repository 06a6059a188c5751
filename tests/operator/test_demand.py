"""Reading load from real HTTP servers that serve the sandbox server's `/v1/status` schema."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path

from aiohttp import web

from cuda_agent.operator.demand import ProbeSettings, endpoint_for, probe_pods
from cuda_agent.operator.views import PodView


def pod(name: str, ip: str | None) -> PodView:
    return PodView(name, "Running", True, ip, None, None, False, ())


def test_pod_ips_outside_the_allowed_networks_are_never_contacted() -> None:
    loopback = [ipaddress.ip_network("127.0.0.0/8")]
    assert endpoint_for("ns", pod("a", "10.0.0.7"), 8000, {}, loopback) is None
    assert endpoint_for("ns", pod("a", "127.0.0.9"), 8000, {}, loopback) == "http://127.0.0.9:8000"
    mapped = {"ns/a": "http://127.0.0.1:9001"}
    assert endpoint_for("ns", pod("a", "10.0.0.7"), 8000, mapped, loopback) == "http://127.0.0.1:9001"


def test_probe_reads_status_and_marks_unreachable_pods_silent(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, int | None, int | None]]:
        async def status(request: web.Request) -> web.Response:
            return web.json_response({"activeSessions": 3, "queuedJudgeJobs": 2, "gpu": "cpu"})

        app = web.Application()
        app.router.add_get("/v1/status", status)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        mapping = tmp_path / "endpoints.json"
        mapping.write_text(json.dumps({"ns/up": f"http://127.0.0.1:{port}", "ns/down": "http://127.0.0.1:9"}))
        settings = ProbeSettings(
            allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),), endpoint_map=mapping
        )
        try:
            loads = await probe_pods(
                "ns", [pod("up", None), pod("down", None), pod("far", "10.1.2.3")], 8000, settings
            )
        finally:
            await runner.cleanup()
        return [(load.pod, load.active_sessions, load.queued_judge_jobs) for load in loads]

    assert asyncio.run(scenario()) == [("up", 3, 2), ("down", None, None), ("far", None, None)]
