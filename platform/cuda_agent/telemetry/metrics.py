"""Prometheus metrics of the trainer and the agent loop, and the /metrics endpoint of any process.

Metrics go through prometheus_client, not the OpenTelemetry metrics SDK: every consumer of these numbers
scrapes Prometheus (the operator's and sandbox server's /metrics, the autoscaler, dashboards), and one
library in every process means one exposition format and one set of names (docs/telemetry.md says more).
The families below live in the process-wide default registry, as prometheus_client intends; a process
serves them with `serve_metrics(port)` (the trainer when CUDA_AGENT_METRICS_PORT is set).
"""

from __future__ import annotations

from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Episodes take seconds to hours; weight syncs take seconds to minutes.
EPISODE_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0, 7200.0)
SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

EPISODES = Counter(
    "cuda_agent_episodes",
    "agent-loop episodes finished, by how they ended and their milestone reward",
    ["end", "reward"],
)
EPISODES_IN_FLIGHT = Gauge("cuda_agent_episodes_in_flight", "agent-loop episodes running in this process")
EPISODE_SECONDS = Histogram(
    "cuda_agent_episode_seconds",
    "wall time of agent-loop episodes, retries included",
    buckets=EPISODE_BUCKETS,
)
GENERATED_TOKENS = Counter("cuda_agent_generated_tokens", "tokens the policy generated in agent-loop turns")

TRAINER_STEP = Gauge("cuda_agent_trainer_step", "steps finished in the stage", ["stage"])
STEP_REWARD = Gauge("cuda_agent_trainer_reward", "mean episode reward of the stage's last step", ["stage"])
STEP_PASS_RATE = Gauge(
    "cuda_agent_trainer_pass_rate", "share of the last step's episodes judged correct", ["stage"]
)
STEP_FASTER_THAN_COMPILE = Gauge(
    "cuda_agent_trainer_faster_than_compile_rate",
    "share of the last step's episodes faster than torch.compile",
    ["stage"],
)
ROLLOUT_TOKENS_PER_GPU_S = Gauge(
    "cuda_agent_trainer_rollout_tokens_per_second_per_gpu",
    "policy tokens generated per second of the last step's rollout, per rollout GPU",
    ["stage"],
)
WEIGHT_SYNC_SECONDS = Histogram(
    "cuda_agent_trainer_weight_sync_seconds", "actor -> rollout weight sync time", buckets=SYNC_BUCKETS
)

# How PPO and the warm-up stages move the policy and the critic: whether the clip binds, how far an
# update moves the policy, how peaked it is, how well the critic fits, how far RFT brought the NLL.
STEP_CLIP_FRACTION = Gauge(
    "cuda_agent_trainer_clip_fraction", "share of policy tokens whose ratio the PPO clip bound", ["stage"]
)
STEP_APPROX_KL = Gauge(
    "cuda_agent_trainer_approx_kl", "mean log-ratio of the policy before and after the step", ["stage"]
)
STEP_ENTROPY = Gauge("cuda_agent_trainer_entropy", "mean per-token policy entropy of the batch", ["stage"])
STEP_EXPLAINED_VARIANCE = Gauge(
    "cuda_agent_trainer_explained_variance", "explained variance of the critic's values", ["stage"]
)
STEP_NLL = Gauge("cuda_agent_trainer_nll", "token-mean NLL of the RFT set's policy tokens", ["stage"])

# Step metric (the trainer's history key) -> gauge.
_STEP_GAUGES = {
    "reward": STEP_REWARD,
    "pass_rate": STEP_PASS_RATE,
    "faster_than_compile_rate": STEP_FASTER_THAN_COMPILE,
    "clip_fraction": STEP_CLIP_FRACTION,
    "approx_kl": STEP_APPROX_KL,
    "entropy": STEP_ENTROPY,
    "explained_variance": STEP_EXPLAINED_VARIANCE,
    "nll": STEP_NLL,
}


def record_episode(end: str, reward: float, wall_s: float, generated_tokens: int) -> None:
    # Rewards are the milestone scale {-1, 1, 2, 3}: a label, not a histogram.
    EPISODES.labels(end=end, reward=f"{reward:g}").inc()
    EPISODE_SECONDS.observe(wall_s)
    GENERATED_TOKENS.inc(generated_tokens)


def record_step(
    stage: str,
    step: int,
    metrics: Mapping[str, float],
    *,
    generated_tokens: int = 0,
    rollout_gpus: int = 1,
) -> None:
    """One finished trainer step: its stage position, the step's metrics the gauges know (reward,
    pass rate, faster-than-compile, weight_sync_s) and rollout throughput from `rollout_s`."""
    TRAINER_STEP.labels(stage=stage).set(step)
    for key, gauge in _STEP_GAUGES.items():
        if key in metrics:
            gauge.labels(stage=stage).set(metrics[key])
    if "weight_sync_s" in metrics:
        WEIGHT_SYNC_SECONDS.observe(metrics["weight_sync_s"])
    rollout_s = metrics.get("rollout_s", 0.0)
    if generated_tokens and rollout_s > 0:
        ROLLOUT_TOKENS_PER_GPU_S.labels(stage=stage).set(generated_tokens / rollout_s / max(1, rollout_gpus))


def serve_metrics(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> WSGIServer:
    """Serve `registry` as Prometheus /metrics on a background thread (port 0 picks a free port: read
    it from the returned server's `server_port`; `shutdown()` stops it)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
