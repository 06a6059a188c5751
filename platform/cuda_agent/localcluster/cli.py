"""`cuda-agent cluster up|down|kubeconfig|status`: the local control plane from a shell.

cuda-agent cluster up                  # etcd + apiserver + controllers + kwok, 16 fake 8-GPU nodes
export KUBECONFIG=$(cuda-agent cluster kubeconfig)
cuda-agent cluster status
cuda-agent cluster down
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cuda_agent.localcluster.binaries import BuildError, GoMissingError
from cuda_agent.localcluster.cluster import (
    ClusterConfig,
    ClusterError,
    ClusterStatus,
    KubectlError,
    LocalCluster,
)

REPO_CRDS = Path(__file__).resolve().parents[3] / "crds"


def _cluster_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """--name and --workdir: on the top parser with their defaults, and again on every subcommand (as a
    parent) with no default, so `cluster status --name x` and `cluster --name x status` mean the same and a
    subcommand that is not given the option keeps the value from before it."""
    parser.add_argument(
        "--name",
        default="cuda-agent" if defaults else argparse.SUPPRESS,
        help="cluster name (default: cuda-agent)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None if defaults else argparse.SUPPRESS,
        help="kwokctl state directory (default: ~/.cache/cuda-agent/kwok)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuda-agent cluster", description=__doc__.splitlines()[0])
    _cluster_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _cluster_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up", parents=[common], help="start the control plane, install CRDs, create fake GPU nodes"
    )
    up.add_argument("--nodes", type=int, default=16, help="fake GPU nodes (default: %(default)s)")
    up.add_argument(
        "--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node (default: %(default)s)"
    )
    up.add_argument("--gpu-product", default="NVIDIA-H200", help="nvidia.com/gpu.product label")
    up.add_argument("--crds", type=Path, default=REPO_CRDS, help="directory of CRD YAML to install")
    sub.add_parser("down", parents=[common], help="stop every component and delete the cluster's state")
    sub.add_parser("kubeconfig", parents=[common], help="print the kubeconfig path (for KUBECONFIG=...)")
    status = sub.add_parser("status", parents=[common], help="components, apiserver readiness and nodes")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    settings: dict[str, object] = {"name": args.name}
    if args.workdir is not None:
        settings["workdir"] = args.workdir
    if args.command == "up":
        settings |= {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "gpu_product": args.gpu_product,
        }
    cluster = LocalCluster(ClusterConfig.model_validate(settings))
    try:
        return _run(cluster, args)
    except (ClusterError, KubectlError, GoMissingError, BuildError) as err:
        print(f"cuda-agent cluster {args.command}: {err}", file=sys.stderr)
        if args.command == "up" and cluster.exists():
            print(f"the cluster is left as it is: `cuda-agent cluster --name {args.name} down` removes it")
        return 1


def _run(cluster: LocalCluster, args: argparse.Namespace) -> int:
    if args.command == "up":
        bring_up(cluster, args.crds)
        print(f"cluster {cluster.config.name!r} is up at {cluster.server()}")
        print(f"export KUBECONFIG={cluster.kubeconfig_path()}")
    elif args.command == "down":
        cluster.down()
        print(f"cluster {cluster.config.name!r} is down")
    elif args.command == "kubeconfig":
        if not cluster.exists():
            print(
                f"cluster {cluster.config.name!r} does not exist: run `cuda-agent cluster up`",
                file=sys.stderr,
            )
            return 1
        print(cluster.kubeconfig_path())
    else:
        status = cluster.status()
        print(status.model_dump_json(indent=2) if args.json else describe(status))
        return 0 if status.apiserver_ready else 1
    return 0


def describe(status: ClusterStatus) -> str:
    if not status.exists:
        return f"cluster {status.name!r} does not exist"
    readiness = "ready" if status.apiserver_ready else "NOT ready"
    components = ", ".join(f"{c.name} {c.state}" for c in status.components) or "none found"
    return "\n".join(
        [
            f"cluster {status.name!r}: kube-apiserver {readiness} at {status.server}",
            f"kubeconfig: {status.kubeconfig}",
            f"components: {components}",
            f"nodes: {status.nodes} ({status.ready_nodes} Ready)",
        ]
    )


def bring_up(cluster: LocalCluster, crds: Path) -> list[str]:
    """Control plane + CRDs + GPU nodes: what `cluster up`, the demo and the test fixture all start from."""
    cluster.up()
    installed = cluster.install_crds(crds) if crds.is_dir() else []
    cluster.create_gpu_nodes()
    return installed
