"""The local executor: a TrainingRun's trainer and its sandbox server as processes on this machine.

The embedded default (`cuda-agent demo`) runs the control plane with kwok nodes, which cannot run pods. With
`cuda-agent operator --executor local` a run gets, instead of Ray and driver pods, a sandbox server judging
kernels on this machine's CPU (or GPU) and `cuda-agent train -f <run.yaml>` with exactly what a driver pod
gets: the run file the ConfigMap holds, the TrainerEnv contract, the artifacts Secret as environment, and a
kubeconfig carrying a token of the run's trainer ServiceAccount (so it may patch its own run's status and
nothing else, as in a pod). Each process is supervised: logs to files under `<run_dir>/<namespace>/<run>/`,
restart with doubling backoff after a crash (the trainer resumes from its last checkpoint), stopped on
suspension, completion and deletion, and its exit reason ends up in the run's conditions.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import logging
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import aiohttp
import yaml

from cuda_agent.api.episode import on_this_machine
from cuda_agent.api.pool_server import server_config
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.localhost import free_port
from cuda_agent.operator import labels as lb
from cuda_agent.operator.compute import Compute, DriverState
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.kube import KubeError, Ref
from cuda_agent.operator.run_children import RunContext, run_config, trainer_env
from cuda_agent.operator.tenancy import ARTIFACTS_ENV_NAMES
from cuda_agent.sandbox.local import local_settings, traversable_temp_dir, write_config
from cuda_agent.storage.config import ENV_NAMES

log = logging.getLogger(__name__)
ProcessState = Literal["starting", "running", "backoff", "succeeded", "failed", "stopped"]
STOP_GRACE_SECONDS = 20.0  # SIGTERM, then SIGKILL: time for a trainer to write its checkpoint
MAX_BACKOFF_SECONDS = 60.0
TOKEN_SECONDS = 24 * 3600
HEALTH_POLL_SECONDS = 0.5
PR_SET_PDEATHSIG = 1
STARTING = "StartingSandboxServer"  # Provisioning's reason until the local sandbox server answers


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the operator dies, as a pod dies with its node. A restarted
    operator starts the run again and the trainer resumes from its checkpoint (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Supervised:
    """One process kept running: restarted after a crash with doubling backoff, up to `max_restarts`
    (None: forever). `on_change` is called whenever its state changes (the run's owner is requeued)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    on_change: Callable[[], None]
    backoff: float
    max_restarts: int | None
    cwd: Path | None = None  # the trainer's: relative outputs (plots, summaries) land in its run directory
    restart_on_success: bool = False
    state: ProcessState = "starting"
    restarts: int = 0
    last_exit: str = ""
    pid: int | None = None
    _process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"supervise-{self.name}")

    async def _supervise(self) -> None:
        delay = self.backoff
        while True:
            code = await self._run_once()
            self.last_exit = _describe_exit(code)
            if code == 0 and not self.restart_on_success:
                self._set("succeeded")
                return
            self.restarts += 1
            if self.max_restarts is not None and self.restarts >= self.max_restarts:
                self._set("failed")
                return
            log.warning(
                "%s exited (%s); restart %d in %.1f s", self.name, self.last_exit, self.restarts, delay
            )
            self._set("backoff")
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    async def _run_once(self) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as sink:
            try:
                self._process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    env=self.env,
                    cwd=self.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=sink,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() reaches its children too
                    preexec_fn=_die_with_parent,
                )
            except OSError as error:
                sink.write(f"cuda-agent operator: cannot start {self.argv[0]}: {error}\n".encode())
                return 127
        self.pid = self._process.pid
        self._set("running")
        return await self._process.wait()

    def _set(self, state: ProcessState) -> None:
        self.state = state
        self.on_change()

    async def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after the grace period; the state becomes `stopped`
        unless the process had already finished."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        process = self._process
        if process is not None and process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_SECONDS)
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
            self.last_exit = _describe_exit(process.returncode or 0)
        if self.state not in ("succeeded", "failed"):
            self.state = "stopped"


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


@dataclass
class LocalRun:
    """What one run has on this machine."""

    directory: Path
    sandbox_url: str
    # The trainer's /metrics, on loopback (a pod's fixed port would collide between local runs); kept
    # across restarts so a scrape target stays valid.
    metrics_port: int = field(default_factory=free_port)
    # In /tmp, not under the run directory: in root mode the sandbox's per-session uids must be able to
    # traverse every ancestor of its state, and a home directory (or a test's temp dir) is private.
    sandbox_state: Path = field(default_factory=lambda: traversable_temp_dir("cuda-agent-sandbox-"))
    sandbox: Supervised | None = None
    sandbox_ready: bool = False
    # The run's pool as the sandbox server above serves it on this machine (its GPUs those this machine
    # has): the server's config and the trainer's episode settings both come from it.
    pool: SandboxPoolSpec | None = None
    trainer: Supervised | None = None
    health: asyncio.Task[None] | None = None


class LocalExecutor:
    """Runs each TrainingRun's sandbox server and trainer as supervised local processes."""

    gang_admission = False  # the trainer runs on this machine, not on the cluster's GPU nodes

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.runs: dict[tuple[str, str], LocalRun] = {}

    def directory(self, namespace: str, name: str) -> Path:
        return self.config.run_dir / namespace / name

    async def observe(self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec) -> Compute:
        local = self.runs.get((run.namespace, run.name))
        if local is None or local.sandbox is None:
            return Compute(
                False, False, "local sandbox server not started", "absent", "trainer not started", STARTING
            )
        sandbox, trainer = local.sandbox, local.trainer
        exists = sandbox.state not in ("stopped", "failed") or (
            trainer is not None and trainer.state in ("running", "backoff")
        )
        if local.sandbox_ready and sandbox.state == "running":
            ready, ready_message = True, f"local sandbox server at {local.sandbox_url}"
        else:
            ready = False
            ready_message = f"local sandbox server {sandbox.state}" + (
                f" (last {sandbox.last_exit}; log {sandbox.log_path})" if sandbox.last_exit else ""
            )
        driver, driver_message = trainer_state(trainer, local.metrics_port)
        return Compute(
            exists,
            ready,
            ready_message,
            driver,
            driver_message,
            STARTING,
            failure_reason="BackoffLimitExceeded",
        )

    async def log_tail(self, context: OperatorContext, run: RunContext, lines: int) -> str:
        path = self.directory(run.namespace, run.name) / "trainer.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(trainer log {path} could not be read: {error})"

    async def ensure(
        self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec
    ) -> tuple[list[str], list[str]]:
        """The sandbox server, then (once it answers) the trainer."""
        key = (run.namespace, run.name)
        local = self.runs.get(key)
        if local is None:
            # The sandbox keeps this port across restarts: the trainer's CUDA_AGENT_SANDBOX_URL stays valid.
            local = LocalRun(self.directory(*key), f"http://127.0.0.1:{free_port()}")
            self.runs[key] = local
        requeue = _requeue(context, run)
        started: list[str] = []
        try:
            if local.sandbox is None or local.sandbox.state in ("stopped", "failed"):
                pool = await _pool_spec(context, run.namespace, spec.sandbox_pool_ref.name)
                local.pool = on_this_machine(pool)
                local.sandbox = self._sandbox(local, local.pool, requeue)
                local.sandbox_ready = False
                local.sandbox.start()
                if local.health is not None:
                    local.health.cancel()
                local.health = asyncio.create_task(_watch_health(local, requeue))
                started.append("sandbox server")
            if local.sandbox_ready and (local.trainer is None or local.trainer.state == "stopped"):
                local.trainer = await self._trainer(context, local, run, spec, requeue)
                local.trainer.start()
                started.append("trainer")
        except (KubeError, OSError, ValueError) as error:
            return started, [f"local executor: {error}"]
        return started, []

    def _sandbox(self, local: LocalRun, pool: SandboxPoolSpec, requeue: Callable[[], None]) -> Supervised:
        """`cuda-agent sandbox serve` with the config a pool's pod gets, placed on this machine as every
        local server is (cuda_agent.sandbox.local: loopback only, its own uid range, the installed judge
        files), on the run's fixed port, state in a traversable temp directory, the pool's GPUs that this
        machine has (`pool` is already placed: api/episode.on_this_machine)."""
        port = int(local.sandbox_url.rsplit(":", 1)[1])
        settings = local_settings(server_config(pool), port, local.sandbox_state / "state")
        config_path = write_config(settings, local.directory / "sandbox.yaml")
        argv = [part.replace("{config}", str(config_path)) for part in self.config.sandbox_command]
        return Supervised(
            name=f"sandbox {local.directory.name}",
            argv=argv,
            # The operator's environment without its cluster credentials: a sandbox pod has none either.
            env={key: value for key, value in os.environ.items() if key != "KUBECONFIG"},
            log_path=local.directory / "sandbox.log",
            on_change=requeue,
            backoff=self.config.restart_backoff,
            max_restarts=None,  # a server is kept up for as long as the run needs it
            restart_on_success=True,
        )

    async def _trainer(
        self,
        context: OperatorContext,
        local: LocalRun,
        run: RunContext,
        spec: TrainingRunSpec,
        requeue: Callable[[], None],
    ) -> Supervised:
        """`cuda-agent train -f run.yaml` with a driver pod's run file, environment and identity."""
        body = context.owner((lb.RUN_KIND, run.namespace, run.name)) or {}
        run_yaml = local.directory / "run.yaml"
        run_yaml.write_text(run_config(run, body.get("spec") or {})["data"]["run.yaml"])
        kubeconfig = await _trainer_kubeconfig(context, run, local.directory / "kubeconfig")
        env = {key: value for key, value in os.environ.items() if not key.startswith("CUDA_AGENT_")}
        env |= await _secret_env(context, run.namespace, run.artifacts_secret)
        placed = replace(run, pool=local.pool)  # sessions ask for what this machine's server judges on
        env |= trainer_env(placed, spec, local.sandbox_url, None, local.metrics_port).to_environ()
        env |= {"KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        if self.config.pvc_root is not None:
            env[ENV_NAMES["pvc_root"][0]] = str(self.config.pvc_root)  # read by cuda_agent.storage
        argv = [part.replace("{run_yaml}", str(run_yaml)) for part in self.config.trainer_command]
        return Supervised(
            name=f"trainer {run.namespace}/{run.name}",
            argv=argv,
            env=env,
            log_path=local.directory / "trainer.log",
            on_change=requeue,
            backoff=self.config.restart_backoff,
            max_restarts=spec.run_policy.backoff_limit + 1,  # the crash after the last allowed restart
            cwd=local.directory,
        )

    async def remove(self, context: OperatorContext, run: RunContext, keep_finished: bool) -> list[str]:
        return await self._stop((run.namespace, run.name), keep_finished=keep_finished)

    async def _stop(self, key: tuple[str, str], keep_finished: bool) -> list[str]:
        local = self.runs.get(key)
        if local is None:
            return []
        if local.health is not None:
            local.health.cancel()
        stopped = []
        for process in (local.trainer, local.sandbox):
            if process is not None:
                if process.state not in ("stopped", "succeeded", "failed"):
                    stopped.append(process.name)
                await process.stop()
        finished = local.trainer is not None and local.trainer.state in ("succeeded", "failed")
        if not (keep_finished and finished):
            if self.runs.get(key) is local:  # a deletion and the operator's shutdown may both stop it
                del self.runs[key]  # a resumed run starts afresh (from its checkpoint)
            shutil.rmtree(local.sandbox_state, ignore_errors=True)
        return stopped

    def forget(self, namespace: str, name: str) -> None:
        if (namespace, name) in self.runs:
            task = asyncio.get_running_loop().create_task(self._stop((namespace, name), keep_finished=False))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def close(self) -> None:
        for key in list(self.runs):
            await self._stop(key, keep_finished=False)


_background: set[asyncio.Task[list[str]]] = set()  # keeps fire-and-forget stops alive until they finish


def trainer_state(trainer: Supervised | None, metrics_port: int | None = None) -> tuple[DriverState, str]:
    """(state, message) of a local trainer, in the terms of a driver pod."""
    if trainer is None:
        return "absent", "trainer not started"
    where = f"log {trainer.log_path}"
    if trainer.state == "succeeded":
        return "complete", f"trainer finished ({where})"
    if trainer.state == "failed":
        failures = f"trainer exited with an error {trainer.restarts} times; last: {trainer.last_exit}"
        return "failed", f"{failures} ({where})"
    if trainer.state == "running":
        metrics = f", /metrics on http://127.0.0.1:{metrics_port}" if metrics_port else ""
        return "active", f"trainer running, pid {trainer.pid}{metrics}"
    if trainer.state == "backoff":
        return "pending", f"trainer restarting after {trainer.last_exit} ({trainer.restarts}; {where})"
    return "pending", "trainer starting"


def _requeue(context: OperatorContext, run: RunContext) -> Callable[[], None]:
    key = (lb.RUN_KIND, run.namespace, run.name)
    return lambda: context.queue.add(key)


async def _watch_health(local: LocalRun, requeue: Callable[[], None]) -> None:
    """Poll the sandbox server's /healthz; mark it ready (and requeue the run) when it answers, and not
    ready while it restarts. Not traced: a poll every HEALTH_POLL_SECONDS outside any pass would be a
    trace of one span twice a second (the server does not trace /healthz either)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            healthy = False
            if local.sandbox is not None and local.sandbox.state == "running":
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{local.sandbox_url}/healthz") as response:
                        healthy = response.status == 200
            if healthy != local.sandbox_ready:
                local.sandbox_ready = healthy
                requeue()
            await asyncio.sleep(HEALTH_POLL_SECONDS)


async def _pool_spec(context: OperatorContext, namespace: str, pool: str) -> SandboxPoolSpec:
    body = context.owner((lb.POOL_KIND, namespace, pool))
    if body is None:
        raise ValueError(f"SandboxPool {namespace}/{pool} does not exist")
    return SandboxPoolSpec.model_validate(body.get("spec") or {})


async def _secret_env(context: OperatorContext, namespace: str, name: str) -> dict[str, str]:
    """The artifacts Secret's storage settings as environment variables, each by name, as a driver pod
    gets them. No other key passes: the Secret is the run author's, and a key such as PYTHONWARNINGS or
    BROWSER would run their command as the operator's user at every trainer start."""
    secret = await context.kube.get(Ref("Secret", namespace, name)) or {}
    data: Mapping[str, str] = secret.get("data") or {}
    return {
        key: base64.b64decode(data[key]).decode(errors="replace")
        for key in ARTIFACTS_ENV_NAMES
        if key in data
    }


async def _trainer_kubeconfig(context: OperatorContext, run: RunContext, path: Path) -> Path:
    """A kubeconfig for the run's trainer ServiceAccount (a fresh bound token), so the local trainer
    has the Role a driver pod has: read its run, patch its status."""
    server, ca_file = context.kube.server()
    token = await context.kube.service_account_token(
        run.namespace, lb.trainer_account_name(run.name), TOKEN_SECONDS
    )
    cluster: dict[str, str] = {"server": server}
    if ca_file:
        cluster["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "trainer", "user": {"token": token}}],
        "contexts": [
            {
                "name": "trainer",
                "context": {"cluster": "local", "user": "trainer", "namespace": run.namespace},
            }
        ],
        "current-context": "trainer",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
