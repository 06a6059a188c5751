"""The sandbox config the operator renders for a SandboxPool's pods always passes the server's own
config model (`cuda-agent sandbox serve --config` would otherwise exit 2 in every pod of the pool), for
every spec admission accepts: each limit at its minimum and maximum, with and without autoscaling."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from cuda_agent.api import ResourceError, load_resource
from cuda_agent.api.pool_server import server_config
from cuda_agent.sandbox.server.config import SandboxServerConfig

LIMIT_EXTREMES: dict[str, list[Any]] = {
    "buildTimeoutSeconds": [1, 3600],
    "runTimeoutSeconds": [1, 3600],
    "memory": ["2Gi", "16Ti"],
    "pids": [64, 1_000_000],
    "workspaceSize": ["64Mi", "1Ti"],
}
AUTOSCALING = [None, {"minReplicas": 0, "maxReplicas": 1, "targetSessionsPerReplica": 1},
               {"minReplicas": 0, "maxReplicas": 1024, "targetSessionsPerReplica": 1024}]  # fmt: skip


def _pool(limits: dict[str, Any], autoscaling: dict[str, Any] | None, gpus: int) -> Any:
    spec: dict[str, Any] = {"image": "cuda-agent-sandbox:0.1.0", "limits": limits, "gpu": {"count": gpus}}
    if autoscaling is not None:
        spec |= {"autoscaling": autoscaling, "replicas": autoscaling["minReplicas"]}
    return load_resource(
        {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "SandboxPool",
            "metadata": {"name": "p"},
            "spec": spec,
        }
    )


@pytest.mark.parametrize("autoscaling", AUTOSCALING, ids=["fixed", "smallest", "largest"])
@pytest.mark.parametrize("gpus", [0, 16])
def test_every_accepted_extreme_renders_a_config_the_server_accepts(
    autoscaling: dict[str, Any] | None, gpus: int
) -> None:
    for values in itertools.product(*LIMIT_EXTREMES.values()):
        limits = dict(zip(LIMIT_EXTREMES, values, strict=True))
        config = SandboxServerConfig.model_validate(server_config(_pool(limits, autoscaling, gpus).spec))
        assert config.workspace_quota_mib >= 64
        assert config.bash_default_timeout_s <= config.bash_max_timeout_s


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory", "1Gi"), ("memory", "17Ti"), ("workspaceSize", "15Mi"), ("workspaceSize", "1025Gi")],
)
def test_sizes_outside_what_the_server_accepts_are_refused(field: str, value: str) -> None:
    with pytest.raises(ResourceError, match=f"spec.limits.{field} must be between"):
        _pool({field: value}, None, 1)
