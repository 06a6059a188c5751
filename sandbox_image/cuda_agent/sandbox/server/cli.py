"""`cuda-agent sandbox serve`: start one sandbox server.

    cuda-agent sandbox serve --host 127.0.0.1 --port 8470 --state-dir /var/lib/cuda-agent-sandbox
    cuda-agent sandbox serve --config sandbox.yaml --port 0     # port 0: any free port, printed on start

Every SandboxServerConfig field is a flag (`--max-sessions 64`, `--max-concurrent-judges 4`, ...); nested
limits are set from a --config YAML file. Startup checks the environment (state directory reachable by
the sandbox users, uid range free, isolation working) and exits 2 with one line naming the problem.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import pwd
import signal
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cuda_agent.api.sandbox import machine_gpus
from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.init import run_under_init
from cuda_agent.sandbox.server.isolation import (
    Isolation,
    IsolationError,
    detect_mode,
    harden_server_process,
    kill_uid_processes,
    landlock_abi,
)
from cuda_agent.sandbox.server.judge_seed import SeedRefused, usable_judge_seed

log = logging.getLogger("cuda_agent.sandbox")

_SCALAR_FLAGS = {
    name: field
    for name, field in SandboxServerConfig.model_fields.items()
    if name not in ("agent_limits", "judge_limits", "judge_command", "mask_paths", "env_passthrough")
}

_FLAG_ALIASES = {"judge_seed_dir": ("--judge-seed",)}


class StartupError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuda-agent sandbox", description="the kernel sandbox server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--config", type=Path, help="YAML file with SandboxServerConfig fields")
    for name, field in _SCALAR_FLAGS.items():
        flags = ["--" + name.replace("_", "-"), *_FLAG_ALIASES.get(name, ())]
        serve.add_argument(*flags, dest=name, default=None, help=field.description)
    serve.add_argument("--judge-command", default=None, help="the judge CLI as one shell-quoted string")
    serve.add_argument("--log-level", default="INFO")
    return parser


def load_config(args: argparse.Namespace) -> SandboxServerConfig:
    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            loaded = yaml.safe_load(args.config.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise StartupError(f"--config {args.config}: {exc}") from None
        if not isinstance(loaded, dict):
            raise StartupError(f"--config {args.config}: expected a mapping of config fields")
        values.update(loaded)
    values.update({k: getattr(args, k) for k in _SCALAR_FLAGS if getattr(args, k) is not None})
    if args.judge_command:
        import shlex

        values["judge_command"] = shlex.split(args.judge_command)
    try:
        return SandboxServerConfig.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StartupError(f"invalid sandbox config: {where}: {first['msg']}") from None


def count_gpus(configured: int | None) -> int:
    return configured if configured is not None else machine_gpus()


def check_environment(config: SandboxServerConfig, mode: str) -> int | None:
    """Prepare the state directory; in root mode lock the uid range. Returns the lock fd to keep open."""
    state = config.state_dir
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o711)
    if mode != "root":
        return None
    # The sandbox uids must reach their workspace below the state directory.
    for parent in [state, *state.resolve().parents]:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            raise StartupError(f"--state-dir {state}: {parent} is not searchable by other users (chmod o+x)")
    # Hard links to files an agent cannot write (the judge's, say) are refused only with this on.
    protected = Path("/proc/sys/fs/protected_hardlinks")
    if protected.exists() and protected.read_text().strip() != "1":
        log.warning("fs.protected_hardlinks is off: agents could hard-link files they cannot write")
    for uid in config.sandbox_uids:
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            continue
        raise StartupError(
            f"--uid-base {config.uid_base}: uid {uid} belongs to user {entry.pw_name!r}; choose a free range"
        )
    lock_dir = Path("/run/cuda-agent-sandbox")
    try:
        lock_dir.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        lock_dir = state
    fd = os.open(lock_dir / f"uids-{config.uid_base}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StartupError(
            f"--uid-base {config.uid_base}: another sandbox server uses this uid range"
        ) from None
    for uid in config.sandbox_uids:
        if uid != config.uid_base - 1:
            kill_uid_processes(uid)  # leftovers of a server that died
    return fd


async def self_test(isolation: Isolation, config: SandboxServerConfig) -> None:
    """Run `true` through the full launch path once, so a broken environment fails at startup."""
    probe = config.state_dir / "probe"
    probe.mkdir(exist_ok=True)
    os.chmod(probe, 0o755)
    for scratch in ("workspace", "tmp", "shm"):  # as a session's (tmp, shm: its /tmp and /dev/shm)
        (probe / scratch).mkdir(exist_ok=True)
    slot = isolation.slot(0)
    env = isolation.base_env() | {"PATH": "/usr/bin:/bin"}
    spec = isolation.agent_spec(slot, ["/bin/sh", "-c", "true"], env, str(probe / "workspace"), [str(probe)])
    proc = await asyncio.create_subprocess_exec(
        *isolation.launch_argv(spec), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={}
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise StartupError(f"isolation self-test failed ({isolation.mode} mode): {out.decode().strip()}")


async def serve(config: SandboxServerConfig, isolation: Isolation, gpus: int) -> None:
    from aiohttp import web

    from cuda_agent.sandbox.server.app import SandboxServer, build_app, build_metrics_app

    await self_test(isolation, config)
    server = SandboxServer(config, isolation, gpus)
    runner = web.AppRunner(build_app(server), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else config.port
    runners = [runner]
    metrics_port = None
    if config.metrics_port is not None:
        metrics_runner = web.AppRunner(build_metrics_app(server), access_log=None, handle_signals=False)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, config.host, config.metrics_port).start()
        metrics_port = metrics_runner.addresses[0][1] if metrics_runner.addresses else config.metrics_port
        runners.insert(0, metrics_runner)
    abi = landlock_abi()
    if not isolation.is_root and abi < 1:
        log.warning("restricted mode without Landlock: sessions sharing this uid can read each other's files")
    print(
        json.dumps(
            {
                "event": "serving",
                "landlock_abi": abi,
                "url": f"http://{config.host}:{port}",
                "port": port,
                "metrics_port": metrics_port,
                "isolation": isolation.mode,
                "user_namespaces": isolation.user_namespaces,
                "gpus": gpus,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for each in runners:  # the metrics listener first: the API runner's cleanup ends the server
        await each.cleanup()


def main(argv: Sequence[str]) -> int:
    from cuda_agent.telemetry import TelemetryConfig, configure_logging, configure_tracing

    args = _parser().parse_args(list(argv))
    # First, while this process has no thread: an init above the server reaps what its children leave.
    run_under_init()
    try:
        # OTEL_* and CUDA_AGENT_LOG_FORMAT (docs/telemetry.md); a bad value stops startup naming it.
        telemetry = TelemetryConfig.from_env(service_name="cuda-agent-sandbox")
    except ValueError as exc:
        print(f"cuda-agent sandbox: {exc}", file=sys.stderr)
        return 2
    # JSON lines carrying the trace id of the request a line was logged in (text when asked).
    configure_logging(args.log_level.upper(), telemetry.log_format)
    try:
        config = load_config(args)
        mode = detect_mode(config.isolation)
        # Before any thread exists: non-dumpable, and (root) a private mount namespace for workspaces.
        private = harden_server_process(private_mounts=mode == "root")
        lock_fd = check_environment(config, mode)
        # Without links: the launcher refuses any link below the state directory in a Landlock rule.
        config = config.model_copy(update={"state_dir": Path(os.path.realpath(config.state_dir))})
        seed = usable_judge_seed(config, mode, landlock_abi() >= 1)
        config = config.model_copy(update={"judge_seed_dir": seed})
        isolation = Isolation(config, mode, private)
        configure_tracing(telemetry)  # after hardening: its exporter starts a thread
        asyncio.run(serve(config, isolation, count_gpus(config.gpus)))
    except (StartupError, IsolationError, SeedRefused) as exc:
        print(f"cuda-agent sandbox: {exc}", file=sys.stderr)
        return 2
    if lock_fd is not None:
        os.close(lock_fd)
    return 0
