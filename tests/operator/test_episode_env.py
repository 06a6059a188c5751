"""The episode settings in a trainer pod's environment: the operator computes them from the run's spec and
the SandboxPool it observed, and the trainer reads them back through the run contract unchanged. The
server-boundary check of the same settings is tests/agent/test_episode_contract.py; the local executor's
(the pool as placed on this machine) is in test_local_executor.py."""

from __future__ import annotations

from typing import Any

import pytest

from cuda_agent.api.run_contract import ENV_EPISODE, TrainerEnv
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator import run_reconciler
from cuda_agent.operator.run_children import RunContext, driver_pod

SPEC = TrainingRunSpec.model_validate(
    {
        "model": {"base": "s3://models/base"},
        "dataset": {"uri": "s3://data/tasks"},
        "sandboxPoolRef": {"name": "pool"},
        "agent": {"maxTurnsTrain": 7, "maxTurnsEval": 9, "maxContextTokens": 8192, "tools": ["bash", "read"]},
        "warmup": {"singleTurnPpo": {"maxContextTokens": 4096}},
        "reward": {"precision": "tf32", "tolerance": {"atol": 0.0, "rtol": 0.004}, "speedupMargin": 0.2},
    }
)


def pool(gpus: int) -> SandboxPoolSpec:
    return SandboxPoolSpec.model_validate({"image": "sandbox:1", "gpu": {"count": gpus}})


def context(observed: SandboxPoolSpec | None) -> RunContext:
    return RunContext(
        name="run",
        namespace="team",
        uid="uid",
        image="img",
        artifacts_secret="artifacts",
        checkpoint_prefix="s3://b/p",
        otel_endpoint=None,
        resume_from=None,
        pool=observed,
    )


def pod_environ(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.mark.parametrize(("gpus", "device"), [(1, "cuda"), (0, "cpu")])
def test_driver_pod_carries_the_episode_settings_of_the_observed_pool(gpus: int, device: str) -> None:
    env = TrainerEnv.from_environ(pod_environ(driver_pod(context(pool(gpus)), SPEC, kuberay=False)))
    assert env.episode is not None
    assert env.episode.device == device
    judge = env.episode.judge
    assert (judge.precision, judge.atol, judge.rtol, judge.margin) == ("tf32", 0.0, 0.004, 0.2)
    assert (env.episode.max_turns(False), env.episode.max_turns(True)) == (7, 9)
    assert (env.episode.max_context_tokens, [t.value for t in env.episode.tools]) == (8192, ["bash", "read"])


def test_an_unobserved_pool_hands_over_no_episode_settings() -> None:
    environ = pod_environ(driver_pod(context(None), SPEC, kuberay=False))
    assert ENV_EPISODE not in environ and TrainerEnv.from_environ(environ).episode is None


class _Watch:
    """Only the watch cache lookup the reconciler makes here (a stand-in: the real one needs a running
    apiserver, which the cluster tests have)."""

    def __init__(self, bodies: dict[tuple[str, str, str], Any]) -> None:
        self.bodies = bodies

    def owner(self, key: tuple[str, str, str]) -> Any:
        return self.bodies.get(key)


def test_the_reconciler_observes_the_runs_pool() -> None:
    gpu_pool = {"spec": {"image": "sandbox:1", "gpu": {"count": 2}}}
    watch: Any = _Watch({("SandboxPool", "team", "pool"): gpu_pool})
    observed = run_reconciler._observed_pool(watch, "team", SPEC)
    assert observed is not None and observed.gpu.count == 2
    assert run_reconciler._observed_pool(_Watch({}), "team", SPEC) is None  # type: ignore[arg-type]
    broken: Any = _Watch({("SandboxPool", "team", "pool"): {"spec": {"gpu": {"count": -1}}}})
    assert run_reconciler._observed_pool(broken, "team", SPEC) is None
