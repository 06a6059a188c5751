"""Leader election for the operator: a coordination.k8s.io/v1 Lease held with the Kubernetes client's own
elector (kubernetes.leaderelection), the mechanism controller-runtime and KubeRay's operator use.

Only the holder runs Kopf. The others wait, answering the liveness probe meanwhile so the kubelet keeps
them, and take the Lease once its holder stops renewing it. A holder that cannot renew within the renew
deadline stops Kopf and exits 1, so its pod restarts as a follower: two reconcilers never overlap by
more than that deadline. The Lease traffic is the elector's (the sync client); everything else the
operator says to the apiserver still goes through kube.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from kubernetes import config as kube_config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from cuda_agent.operator.config import LeaderElectionConfig

log = logging.getLogger(__name__)
LOST_LEADERSHIP = 1
# The elector logs every retry of a follower at INFO ("yet to finish lease_duration"): one line per retry
# period and follower says nothing an operator's log needs; its errors and transitions stay.
_ROUTINE = ("yet to finish lease_duration", "is a follower", "Leader has entered renew loop")


class _QuietFollower(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(part in record.getMessage() for part in _ROUTINE)


async def run_elected(
    election: LeaderElectionConfig,
    kubeconfig: Path | None,
    liveness_endpoint: str | None,
    run: Callable[[asyncio.Event], Awaitable[None]],
) -> int:
    """Waits for the Lease, then awaits `run(lost)`; `lost` is set when the Lease is lost (Kopf's stop
    flag). Returns 0 when `run` ended on its own (a signal), LOST_LEADERSHIP when the Lease was lost."""
    _load_client_config(kubeconfig)
    logging.getLogger("leaderelection").addFilter(_QuietFollower())
    loop = asyncio.get_running_loop()
    leading, lost = asyncio.Event(), asyncio.Event()
    # The kubernetes client ships no annotations for these (as kube.py's calls into it).
    lock = LeaseLock(election.lease_name, election.namespace, election.identity)  # type: ignore[no-untyped-call]
    elector = leaderelection.LeaderElection(  # type: ignore[no-untyped-call]
        electionconfig.Config(  # type: ignore[no-untyped-call]
            lock,
            lease_duration=election.lease_duration,
            renew_deadline=election.renew_deadline,
            retry_period=election.retry_period,
            onstarted_leading=lambda: loop.call_soon_threadsafe(leading.set),
            onstopped_leading=lambda: loop.call_soon_threadsafe(lost.set),
        )
    )
    threading.Thread(target=elector.run, name="leader-election", daemon=True).start()
    lease = f"{election.namespace}/{election.lease_name}"
    log.info("%s waits for the Lease %s", election.identity, lease)
    async with _serving_liveness(liveness_endpoint):
        await leading.wait()
    log.info("%s holds the Lease %s: starting", election.identity, lease)
    await run(lost)
    if lost.is_set():
        log.error("%s lost the Lease %s: stopped, exiting to restart as a follower", election.identity, lease)
        return LOST_LEADERSHIP
    return 0


def _load_client_config(kubeconfig: Path | None) -> None:
    """The sync client's default configuration, which the elector's LeaseLock uses: the kubeconfig
    given, else in-cluster (a pod), else $KUBECONFIG / ~/.kube/config."""
    if kubeconfig is not None:
        kube_config.load_kube_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        return
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]


@contextlib.asynccontextmanager
async def _serving_liveness(endpoint: str | None) -> AsyncIterator[None]:
    """A follower answers the liveness probe's path with 200 until it leads; then Kopf binds the port."""
    if endpoint is None:
        yield
        return
    url = urlsplit(endpoint)
    app = web.Application()
    app.router.add_get(url.path or "/", lambda _: _alive())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def _alive() -> web.Response:
    return web.json_response({"leader": False})
