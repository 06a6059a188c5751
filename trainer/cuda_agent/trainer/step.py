"""One PPO step over a batch of trajectories: experience (old log-probs, reference log-probs, values,
GAE), then the actor and critic updates. Works on the plain roles and on their Ray groups alike: a role is
anything with the methods used here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.trainer import ppo
from cuda_agent.trainer.experience import Episode, episode_from_trajectory, pad_stack


class ActorRole(Protocol):
    def compute_logprobs(self, episodes: list[Episode]) -> list[Episode]: ...
    def train_ppo(self, episodes: list[Episode], mini_batches: list[list[int]]) -> dict[str, float]: ...


class CriticRole(Protocol):
    def compute_values(self, episodes: list[Episode]) -> list[Episode]: ...
    def train_values(
        self,
        episodes: list[Episode],
        mini_batches: list[list[int]],
        *,
        learning_rate: float | None = None,
        clip: bool = True,
    ) -> dict[str, float]: ...


class NllRole(Protocol):
    def train_nll(
        self, episodes: list[Episode], mini_batches: list[list[int]], *, learning_rate: float | None = None
    ) -> dict[str, float]: ...


class ReferenceRole(Protocol):
    def compute_logprobs(self, episodes: list[Episode]) -> list[Episode]: ...


def mini_batch_split(count: int, parts: int, seed: int) -> list[list[int]]:
    """`parts` disjoint index lists covering range(count), in a seeded order (the same on resume)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    size = -(-count // parts)
    return [order[i : i + size] for i in range(0, count, size)]


def _stacked(episodes: Sequence[Episode], name: str, width: int) -> torch.Tensor:
    return pad_stack([getattr(e, name) for e in episodes], width)


def compute_advantages(episodes: list[Episode], spec: TrainingRunSpec) -> dict[str, float]:
    """Token rewards (terminal reward, KL penalty), GAE, whitened advantages; stores them on the episodes."""
    a = spec.algorithm
    width = max(e.length for e in episodes) - 1
    mask = _stacked(episodes, "mask", width)
    values = _stacked(episodes, "values", width)
    old = _stacked(episodes, "old_logprobs", width)
    kl = None
    if episodes[0].ref_logprobs is not None:
        kl = (old - _stacked(episodes, "ref_logprobs", width)) * mask
    rewards = torch.tensor([e.reward for e in episodes])
    token_rewards = ppo.token_rewards(rewards, mask, kl, a.kl_coef)
    advantages, returns = ppo.gae(token_rewards, values, mask, a.gamma, a.gae_lambda)
    advantages = ppo.masked_whiten(advantages, mask)
    for i, e in enumerate(episodes):
        n = e.length - 1
        e.advantages, e.returns = advantages[i, :n].clone(), returns[i, :n].clone()
    metrics = {"explained_variance": ppo.explained_variance(values, returns, mask)}
    if kl is not None:
        metrics["kl"] = float(ppo.masked_mean(kl, mask))
    # How far the training engine's log-probs are from the rollout engine's on the same tokens.
    rollout = _stacked(episodes, "rollout_logprobs", width)
    metrics["rollout_logprob_gap"] = float(ppo.masked_mean((old - rollout).abs(), mask))
    return metrics


def batch_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    n = len(episodes)
    mean = sum(e.reward for e in episodes) / n
    return {
        "reward": mean,
        "reward_std": (sum((e.reward - mean) ** 2 for e in episodes) / n) ** 0.5,
        "episodes_learned": float(n),
        "pass_rate": sum(e.passed for e in episodes) / n,
        "faster_than_compile_rate": sum(e.faster_than_compile for e in episodes) / n,
        "response_length": sum(float(e.mask.sum()) for e in episodes) / n,
        "episode_length": sum(e.length for e in episodes) / n,
        "entropy": sum(e.extras.get("entropy", 0.0) for e in episodes) / n,
    }


def ppo_step(
    trajectories: Sequence[Trajectory],
    actor: ActorRole,
    critic: CriticRole,
    reference: ReferenceRole | None,
    spec: TrainingRunSpec,
    step_seed: int,
    train_gpus: int = 1,
) -> dict[str, float]:
    """Experience then `ppo_epochs` x `mini_batches` actor and critic updates. Returns the step's metrics,
    per-phase seconds and training tokens/s/GPU."""
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    episodes = [episode_from_trajectory(t) for t in trajectories]
    episodes = actor.compute_logprobs(episodes)
    if reference is not None and spec.algorithm.kl_coef > 0:
        episodes = _merge(episodes, reference.compute_logprobs(episodes), "ref_logprobs")
    episodes = _merge(episodes, critic.compute_values(episodes), "values")
    metrics = compute_advantages(episodes, spec)
    timings["experience_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    t = spec.trainer
    for epoch in range(t.ppo_epochs):
        parts = mini_batch_split(len(episodes), t.mini_batches, step_seed * 1000 + epoch)
        metrics.update(actor.train_ppo(episodes, parts))
    timings["actor_update_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    for epoch in range(t.ppo_epochs):
        parts = mini_batch_split(len(episodes), t.mini_batches, step_seed * 1000 + epoch)
        metrics.update(critic.train_values(episodes, parts))
    timings["critic_update_s"] = time.perf_counter() - clock

    metrics.update(batch_metrics(episodes))
    metrics.update(timings)
    tokens = sum(e.length for e in episodes) * t.ppo_epochs
    metrics["train_tokens_per_s_per_gpu"] = tokens / max(sum(timings.values()), 1e-9) / train_gpus
    return metrics


def _merge(episodes: list[Episode], updated: list[Episode], name: str) -> list[Episode]:
    """Copy one attribute back from a role's result (a Ray role returns copies, a local one the same list)."""
    for mine, theirs in zip(episodes, updated, strict=True):
        setattr(mine, name, getattr(theirs, name))
        mine.extras.update(theirs.extras)
    return episodes


def mini_batch_count(count: int, episodes_per_step: int) -> int:
    return max(1, -(-count // episodes_per_step))


def policy_nll(episodes: list[Episode], actor: ActorRole) -> float:
    """Token-mean negative log-likelihood of the policy tokens under the actor as it is now."""
    scored = actor.compute_logprobs(episodes)
    total = sum(float(-(e.old_logprobs * e.mask).sum()) for e in scored if e.old_logprobs is not None)
    return total / max(sum(float(e.mask.sum()) for e in scored), 1.0)


def rft_epoch(
    trajectories: Sequence[Trajectory], actor: NllRole, spec: TrainingRunSpec, epoch_seed: int
) -> dict[str, float]:
    """One pass of rejection fine-tuning over the kept episodes: token-mean NLL of the policy tokens,
    one optimizer step per `rft.miniBatchEpisodes` episodes, at the stage's own learning rate."""
    rft = spec.warmup.rft
    clock = time.perf_counter()
    episodes = [episode_from_trajectory(t) for t in trajectories]
    parts = mini_batch_split(
        len(episodes), mini_batch_count(len(episodes), rft.mini_batch_episodes), epoch_seed
    )
    metrics = actor.train_nll(episodes, parts, learning_rate=rft.learning_rate)
    metrics["actor_update_s"] = time.perf_counter() - clock
    metrics.update(batch_metrics(episodes))
    return metrics


def value_targets(trajectories: Sequence[Trajectory]) -> list[Episode]:
    """Episodes with Monte-Carlo returns (gamma = 1, terminal reward: the reward on every policy token)."""
    episodes = [episode_from_trajectory(t) for t in trajectories]
    for e in episodes:
        e.returns = e.reward * e.mask
    return episodes


def value_fit(episodes: list[Episode], critic: CriticRole) -> tuple[float, float]:
    """Explained variance and mean squared error of the critic's values (computed now, stored on the
    episodes) against the returns, over policy tokens."""
    scored = _merge(episodes, critic.compute_values(episodes), "values")
    width = max(e.length for e in scored) - 1
    values, returns = _stacked(scored, "values", width), _stacked(scored, "returns", width)
    mask = _stacked(scored, "mask", width)
    error = float(ppo.masked_mean((values - returns) ** 2, mask))
    return ppo.explained_variance(values, returns, mask), error


def value_pretraining_epoch(
    episodes: list[Episode], critic: CriticRole, spec: TrainingRunSpec, epoch_seed: int
) -> dict[str, float]:
    """One pass of critic regression onto Monte-Carlo returns with the actor frozen, in mini-batches of
    `valuePretraining.miniBatchEpisodes`, unclipped (the targets are fixed, there are no rollout values
    to stay near). Returns, besides the update's metrics, the explained variance and the mean squared value
    error before and after the pass."""
    vp = spec.warmup.value_pretraining
    clock = time.perf_counter()
    variance_before, error_before = value_fit(episodes, critic)
    parts = mini_batch_split(
        len(episodes), mini_batch_count(len(episodes), vp.mini_batch_episodes), epoch_seed
    )
    lr = vp.learning_rate or spec.algorithm.critic_learning_rate
    metrics = critic.train_values(episodes, parts, learning_rate=lr, clip=False)
    metrics["explained_variance_before"], metrics["value_error_before"] = variance_before, error_before
    metrics["explained_variance"], metrics["value_error"] = value_fit(episodes, critic)
    metrics["critic_update_s"] = time.perf_counter() - clock
    metrics.update(batch_metrics(episodes))
    return metrics
