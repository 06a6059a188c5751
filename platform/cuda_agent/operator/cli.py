"""`cuda-agent operator`: run the SandboxPool / TrainingRun operator against a cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from cuda_agent.operator.config import LeaderElectionConfig, OperatorConfig

# The downward API's names (the chart sets both) and where a pod's service account names its namespace.
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# What Kopf's object loggers attach to every record for their own use (its JSON formatter leaves them
# out too); `k8s_ref`, the object a line is about, stays a field.
KOPF_RECORD_ATTRIBUTES = ("settings", "k8s_skip")


def _pairs(parser: argparse.ArgumentParser, flag: str, items: list[str]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE flags (repeatable) as pairs; a malformed one is a usage error naming the flag."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"{flag} {item!r}: expected KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def parse_args(argv: Sequence[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser(prog="cuda-agent operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="serve this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace (default)")
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG or in-cluster)"
    )
    parser.add_argument("--workers", type=int, default=4, help="objects reconciled concurrently")
    parser.add_argument("--sync-period", type=float, default=15.0, help="seconds between demand reads")
    parser.add_argument("--drain-grace-period", type=float, default=600.0, help="longest session drain, s")
    parser.add_argument(
        "--suspend-checkpoint-timeout", type=float, default=600.0, help="longest wait for a checkpoint, s"
    )
    parser.add_argument(
        "--probe-network",
        action="append",
        default=[],
        help="pod CIDR the autoscaler may contact (repeatable)",
    )
    parser.add_argument("--status-endpoint-map", type=Path, help='JSON {"ns/pod": "http://host:port"}')
    parser.add_argument("--trainer-image", help="image of Ray and trainer pods")
    parser.add_argument(
        "--allowed-trainer-image",
        action="append",
        default=[],
        metavar="IMAGE",
        help="an image a TrainingRun may pick with its cuda-agent.io/trainer-image annotation (repeatable)",
    )
    parser.add_argument("--artifacts-secret", help="Secret with S3/MinIO endpoint and credentials")
    parser.add_argument("--artifacts-bucket", help="bucket of checkpoints when a run names no prefix")
    parser.add_argument(
        "--trainer-pod-annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="on Ray/driver pods",
    )
    parser.add_argument("--otel-endpoint", help="OTLP endpoint given to trainer pods (and tracing pools)")
    parser.add_argument(
        "--otel-collector-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pod label of the OTLP collector (repeatable): pools with spec.telemetry.exportTraces may "
        "reach those pods",
    )
    parser.add_argument(
        "--metrics-scraper-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pod label of the Prometheus that scrapes sandbox pods (repeatable): those pods may reach "
        "the pools' metrics-only port",
    )
    parser.add_argument("--liveness-endpoint", help="e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument(
        "--gang-scheduler-name", help="schedulerName of Ray pods under scheduler-plugins' coscheduling"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port (0: off)"
    )
    parser.add_argument(
        "--executor",
        choices=("cluster", "local"),
        default="cluster",
        help="run trainers in pods (cluster) or as local processes (local: the embedded default)",
    )
    election = parser.add_argument_group("leader election (a coordination.k8s.io Lease; for replicas > 1)")
    election.add_argument("--leader-elect", action="store_true", help="run Kopf only while holding the Lease")
    election.add_argument(
        "--leader-elect-resource-namespace",
        help=f"the Lease's namespace (default: ${POD_NAMESPACE_ENV}, else the pod's service account's)",
    )
    lease = LeaderElectionConfig.model_fields
    election.add_argument(
        "--leader-elect-resource-name", help=f"the Lease's name ({lease['lease_name'].default})"
    )
    election.add_argument(
        "--leader-elect-identity", help=f"holder identity (default: ${POD_NAME_ENV} or the host name + _uuid)"
    )
    for timing in ("lease_duration", "renew_deadline", "retry_period"):
        flag = "--leader-elect-" + timing.replace("_", "-")
        election.add_argument(flag, type=int, help=f"seconds ({lease[timing].default})")
    parser.add_argument("--run-dir", type=Path, help="local executor: run files, logs, sandbox state")
    parser.add_argument(
        "--trainer-command", help="local executor: trainer command line, {run_yaml} = the run file"
    )
    parser.add_argument(
        "--sandbox-command", help="local executor: sandbox server command line, {config} = its config"
    )
    parser.add_argument("--pvc-root", type=Path, help="local executor: directory holding pvc://CLAIM/...")
    parser.add_argument(
        "--restart-backoff", type=float, help="local executor: first restart delay of a crashed process, s"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    args = parser.parse_args(list(argv))
    values = {
        "namespaces": tuple(args.namespace),
        "kubeconfig": args.kubeconfig,
        "workers": args.workers,
        "sync_period": args.sync_period,
        "drain_grace_period": args.drain_grace_period,
        "suspend_checkpoint_timeout": args.suspend_checkpoint_timeout,
        "status_endpoint_map": args.status_endpoint_map,
        "otel_endpoint": args.otel_endpoint,
        "liveness_endpoint": args.liveness_endpoint,
        "metrics_port": args.metrics_port,
        "executor": args.executor,
    }
    values["trainer_pod_annotations"] = _pairs(
        parser, "--trainer-pod-annotation", args.trainer_pod_annotation
    )
    values["otel_collector_labels"] = _pairs(parser, "--otel-collector-label", args.otel_collector_label)
    values["metrics_scraper_labels"] = _pairs(parser, "--metrics-scraper-label", args.metrics_scraper_label)
    if args.probe_network:
        values["probe_networks"] = tuple(args.probe_network)
    values["allowed_trainer_images"] = tuple(args.allowed_trainer_image)
    for option in (
        "trainer_image",
        "artifacts_secret",
        "artifacts_bucket",
        "run_dir",
        "restart_backoff",
        "pvc_root",
        "gang_scheduler_name",
    ):
        if getattr(args, option) is not None:
            values[option] = getattr(args, option)
    for option in ("trainer_command", "sandbox_command"):
        if getattr(args, option):
            values[option] = tuple(shlex.split(getattr(args, option)))
    if args.leader_elect:
        values["leader_election"] = _leader_election(parser, args)
    values["verbose"] = args.verbose
    try:
        return OperatorConfig.model_validate(values)
    except ValidationError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers informed


def _leader_election(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, object]:
    """The Lease's settings: flags, else the pod's downward-API environment and service account."""
    namespace = args.leader_elect_resource_namespace or os.environ.get(POD_NAMESPACE_ENV)
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.exists():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if not namespace:
        parser.error(
            "--leader-elect: no Lease namespace "
            f"(give --leader-elect-resource-namespace or ${POD_NAMESPACE_ENV})"
        )
    # Unique per process, as client-go's: a restarted pod of the same name must not inherit the Lease.
    identity = (
        args.leader_elect_identity
        or f"{os.environ.get(POD_NAME_ENV) or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    )
    settings: dict[str, object] = {"namespace": namespace, "identity": identity}
    for flag, field in (
        ("leader_elect_resource_name", "lease_name"),
        ("leader_elect_lease_duration", "lease_duration"),
        ("leader_elect_renew_deadline", "renew_deadline"),
        ("leader_elect_retry_period", "retry_period"),
    ):
        if getattr(args, flag) is not None:
            settings[field] = getattr(args, flag)
    return settings


async def run_operator(config: OperatorConfig, stop: asyncio.Event | None = None) -> None:
    import kopf

    from cuda_agent.operator.handlers import build_registry
    from cuda_agent.telemetry.config import TelemetryConfig
    from cuda_agent.telemetry.tracing import configure_tracing

    # Reconcile spans go where the standard OTEL_* variables say (nowhere when none is set).
    configure_tracing(TelemetryConfig.from_env(service_name="cuda-agent-operator"))

    await kopf.operator(
        registry=build_registry(),
        memo=kopf.Memo(config=config),
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=config.liveness_endpoint,
        stop_flag=stop,
    )


def configure_operator_logging(verbose: bool, stream: TextIO | None = None) -> None:
    """JSON lines on stderr through the same formatter as the trainer and the sandbox server (fields as
    keys, the current trace's ids); CUDA_AGENT_LOG_FORMAT=text for plain lines. --verbose is DEBUG,
    else CUDA_AGENT_LOG_LEVEL (INFO). A bad variable raises ValueError naming it."""
    from cuda_agent.telemetry.config import TelemetryConfig
    from cuda_agent.telemetry.logs import configure_logging

    telemetry = TelemetryConfig.from_env(service_name="cuda-agent-operator")
    level = "DEBUG" if verbose else telemetry.log_level
    configure_logging(level, telemetry.log_format, stream, hidden=KOPF_RECORD_ATTRIBUTES)
    if not verbose:  # Kopf logs every handler call on every watch event at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    try:
        configure_operator_logging(config.verbose)
    except ValueError as error:
        print(f"cuda-agent operator: {error}", file=sys.stderr)
        return 2
    if config.kubeconfig is not None and not config.kubeconfig.exists():
        print(f"cuda-agent operator: --kubeconfig {config.kubeconfig}: no such file", file=sys.stderr)
        return 2
    if config.leader_election is None:
        asyncio.run(run_operator(config))
        return 0
    from cuda_agent.operator.leader import run_elected

    election = run_elected(
        config.leader_election,
        config.kubeconfig,
        config.liveness_endpoint,
        lambda stop: run_operator(config, stop),
    )
    return asyncio.run(election)
