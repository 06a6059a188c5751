"""`cuda-agent demo` (what `make demo` runs): the platform's custom resources on a real local control plane.

Brings up etcd + kube-apiserver + controllers + kwok with fake 8-GPU nodes, installs the CRDs from crds/,
applies every TrainingRun and SandboxPool in examples/, prints what the apiserver now serves, and tears the
cluster down again (`--keep` leaves it running and prints the kubeconfig path).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cuda_agent.localcluster.binaries import BuildError, GoMissingError
from cuda_agent.localcluster.cli import bring_up
from cuda_agent.localcluster.cluster import ClusterConfig, ClusterError, KubectlError, LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_KINDS = ("TrainingRun", "SandboxPool")


def example_resources(examples: Path) -> list[dict[str, Any]]:
    """Every TrainingRun / SandboxPool document in examples/*.yaml, in file order."""
    resources = []
    for path in sorted(examples.glob("*.yaml")):
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as err:
            raise ClusterError(f"{path}: not valid YAML: {err}") from err
        resources += [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") in DEMO_KINDS]
    return resources


def run_demo(cluster: LocalCluster, crds: Path, examples: Path) -> str:
    """Returns `kubectl get trainingruns,sandboxpools -A` as the real apiserver prints it."""
    if not bring_up(cluster, crds):
        raise ClusterError(f"no CustomResourceDefinitions in {crds}/*.yaml: run `make crds` first")
    resources = example_resources(examples)
    if not resources:
        raise ClusterError(f"no TrainingRun or SandboxPool in {examples}/*.yaml")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(resources, sort_keys=False))
    return cluster.kubectl("get", "trainingruns,sandboxpools", "-A").stdout


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--name", default="cuda-agent-demo", help="cluster name (default: %(default)s)")
    parser.add_argument("--crds", type=Path, default=REPO_ROOT / "crds")
    parser.add_argument("--examples", type=Path, default=REPO_ROOT / "examples")
    args = parser.parse_args(argv)

    cluster = LocalCluster(ClusterConfig(name=args.name))
    try:
        print(run_demo(cluster, args.crds, args.examples), end="")
    except (ClusterError, KubectlError, GoMissingError, BuildError) as err:
        print(f"cuda-agent demo: {err}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            cluster.down()
    if args.keep:
        print(f"\ncluster {args.name!r} left running: export KUBECONFIG={cluster.kubeconfig_path()}")
    return 0
