"""The server configuration a SandboxPool gives its sandbox servers: `cuda-agent sandbox serve --config`.

One mapping from a pool's spec to the server's settings (SandboxServerConfig fields), read by the operator
for the pool's pods (the ConfigMap's sandbox.yaml), by its local executor and by the trainer's
demonstrations, which place it on this machine (cuda_agent.sandbox.local). The pod's paths live here too:
the config names them.

Bottom layer: the API models and the sandbox contract only (no torch, no Kubernetes client).
"""

from __future__ import annotations

from typing import Any

from cuda_agent.api.judge_files import IMAGE_JUDGE_SEED_DIR
from cuda_agent.api.sandbox import SANDBOX_METRICS_PORT, SANDBOX_PORT
from cuda_agent.api.sandboxpool import SandboxPoolSpec, UserNamespaces, mebibytes

JUDGE_DIR = "/opt/cuda-agent/judge"  # the pod's read-only mount of the judge ConfigMap
STATE_DIR = "/var/lib/cuda-agent-sandbox"  # the server's state: session workspaces, build caches
# Sessions one pod accepts: twice the autoscaler's target leaves room for bursts before it scales up.
SESSIONS_PER_TARGET = 2
SESSIONS_WITHOUT_AUTOSCALING = 8


def max_sessions(spec: SandboxPoolSpec) -> int:
    if spec.autoscaling is None:
        return SESSIONS_WITHOUT_AUTOSCALING
    return SESSIONS_PER_TARGET * spec.autoscaling.target_sessions_per_replica


def user_namespaced(spec: SandboxPoolSpec) -> bool:
    return spec.security.user_namespaces == UserNamespaces.REQUIRED


def server_config(spec: SandboxPoolSpec) -> dict[str, Any]:
    """`cuda-agent sandbox serve --config` of the pool's pods: SandboxServerConfig fields from the spec."""
    run_timeout = spec.limits.run_timeout_seconds
    return {
        "host": "0.0.0.0",
        "port": SANDBOX_PORT,
        "metrics_port": SANDBOX_METRICS_PORT,
        "state_dir": STATE_DIR,
        "judge_dir": JUDGE_DIR,
        # Precompiled torch headers built into the image (root-owned, read-only root fs): a session's first
        # build skips ~40 s; an image without them only logs a warning.
        "judge_seed_dir": IMAGE_JUDGE_SEED_DIR,
        "gpus": spec.gpu.count,
        "max_sessions": max_sessions(spec),
        "workspace_quota_mib": mebibytes(spec.limits.workspace_size),
        "bash_default_timeout_s": float(min(120, run_timeout)),
        "bash_max_timeout_s": float(run_timeout),
        # One judge process builds once, then verifies and profiles (each a run).
        "judge_timeout_s": float(spec.limits.build_timeout_seconds + 2 * run_timeout),
        "agent_limits": {"processes": spec.limits.pids},
        **_user_namespace_config(spec),
    }


def _user_namespace_config(spec: SandboxPoolSpec) -> dict[str, str]:
    """A pool that requires user namespaces makes the server refuse to start without them (a visible
    crash loop, not a silent fallback to shared /proc and /dev/shm). The pod's uid 65532 puts the server
    in restricted mode; isolation stays auto so the local executor's root server keeps root mode, whose
    separate uids and namespaces are a superset."""
    return {"user_namespaces": "on"} if user_namespaced(spec) else {}
