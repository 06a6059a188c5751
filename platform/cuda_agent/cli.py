"""`cuda-agent` command line: one subcommand per component, each owning its own argument parser.

Subcommands are imported lazily so that `cuda-agent crds` or `cuda-agent operator` never import torch,
and the sandbox image (no Kopf) can still run `cuda-agent judge`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# name -> ("module:function", one-line help). Each function takes argv (the words after the subcommand)
# and returns a process exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "version": ("cuda_agent.cli:version_main", "print the package version"),
    "crds": ("cuda_agent.api.crdgen:main", "write the CRD YAML generated from the API models"),
    "cluster": ("cuda_agent.localcluster.cli:main", "local control plane: up | down | kubeconfig | status"),
    "demo": ("cuda_agent.demo:main", "run the main job on embedded defaults (local control plane, no GPU)"),
    "operator": ("cuda_agent.operator.cli:main", "run the SandboxPool / TrainingRun operator (Kopf)"),
    "judge": ("cuda_agent.sandbox.judge.cli:main", "judge a candidate kernel against a task"),
    "judge-service": (
        "cuda_agent.sandbox.server.judge_service:main",
        "keep a warm judge for `cuda-agent judge` (CUDA_AGENT_JUDGE_SERVICE)",
    ),
    "judge-seed": (
        "cuda_agent.sandbox.judge.seed:main",
        "build the judge's read-only seed of precompiled torch headers (image / server operator)",
    ),
    "sandbox": ("cuda_agent.sandbox.server.cli:main", "sandbox server: sessions, agent tools, rewards"),
    "train": ("cuda_agent.trainer.cli:main", "train a policy: cuda-agent train -f run.yaml (TrainingRun)"),
    "data": ("cuda_agent.data.cli:main", "synthesize Ops-6K-style tasks: data synth | catalogue | filter"),
    "eval": ("cuda_agent.eval.cli:main", "evaluate solutions or a policy on a KernelBench-format task set"),
}


def version_main(argv: Sequence[str]) -> int:
    from importlib.metadata import version

    print(version("cuda-agent"))
    return 0


def _resolve(target: str) -> Callable[[Sequence[str]], int]:
    module_name, func_name = target.split(":")
    func: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module_name), func_name)
    return func


def _usage() -> str:
    lines = ["usage: cuda-agent [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        return version_main(args[1:])
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"cuda-agent: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _resolve(SUBCOMMANDS[name][0])(rest)


if __name__ == "__main__":
    sys.exit(main())
