"""The trace continues across Ray: the driver's role call carries its context (`trace_context`) and the
actor process, exporting on its own, opens the role's span under the driver's. The actor is the real
RoleWorker with a stand-in role (building a DeepSpeed role is the trainer tests' business); its `call`
is the production method."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.ray_start import init_ray
from otlp_collector import OtlpCollector, running_collector

from cuda_agent.telemetry import Stage, TelemetryConfig, configure_tracing, inject_context, span
from cuda_agent.telemetry import tracing as tracing_module

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")

from cuda_agent.trainer.ray.workers import RoleWorker  # noqa: E402 -- after the Ray environment


class EchoRole:
    def train_ppo(self, episodes: list[int]) -> dict[str, float]:
        return {"episodes": float(len(episodes))}


class TracedRoleWorker(RoleWorker):
    """RoleWorker whose role is EchoRole, exporting to the test's collector."""

    def __init__(self, endpoint: str) -> None:
        configure_tracing(TelemetryConfig(service_name="cuda-agent-trainer-actor", otlp_endpoint=endpoint))
        self.role_name, self.rank, self.role = "actor", 1, EchoRole()

    def flush(self) -> bool:
        provider = tracing_module._provider
        return provider is not None and provider.force_flush()


@pytest.fixture(scope="module")
def ray_session() -> Iterator[Any]:
    started = not ray.is_initialized()
    if started:
        init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # This module is not importable in Ray's workers: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    if started:  # leave a cluster another fixture started alone
        ray.shutdown()


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    with running_collector() as running:
        yield running


def test_role_call_on_a_ray_actor_joins_the_drivers_trace(
    ray_session: Any, collector: OtlpCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing_module, "_provider", None)
    provider = configure_tracing(
        TelemetryConfig(service_name="cuda-agent-trainer", otlp_endpoint=collector.url), set_global=False
    )
    worker = ray.remote(TracedRoleWorker).options(num_cpus=0).remote(collector.url)
    with span(Stage.STEP, stage="ppo", step=1):
        result = ray.get(worker.call.remote("train_ppo", [1, 2, 3], trace_context=inject_context()))
    assert result == {"episodes": 3.0}
    assert ray.get(worker.flush.remote())
    assert provider.force_flush()
    provider.shutdown()
    ray.kill(worker)

    spans = collector.wait_for(lambda got: {"step", "actor.train_ppo"} <= {s.name for s in got})
    (step,) = (s for s in spans if s.name == "step")
    (role_call,) = (s for s in spans if s.name == "actor.train_ppo")
    assert role_call.trace_id == step.trace_id and role_call.parent_id == step.span_id
    assert role_call.attributes == {"cuda_agent.rank": 1}
    assert role_call.resource["service.name"] == "cuda-agent-trainer-actor"
    assert role_call.resource["process.pid"] != step.resource["process.pid"]
