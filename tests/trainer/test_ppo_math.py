"""GAE, the clip-higher policy loss, the clipped value loss and masking against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.trainer import ppo
from cuda_agent.trainer.experience import pack_micro_batches


def test_gae_skips_observation_tokens_and_ends_at_last_policy_token() -> None:
    # Policy tokens at 0, 1, 3; position 2 is tool output (its value 9.0 must not leak in).
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 9.0, 0.1, 7.0]])
    rewards = ppo.token_rewards(torch.tensor([1.0]), mask, None, 0.0)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 1.0, 0.0]]
    advantages, returns = ppo.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # delta3 = 1 - 0.1; delta1 = 0.1 - 0.2; delta0 = 0.2 - 0.5; A_t = delta_t + 0.95 * A_next
    a3 = 0.9
    a1 = -0.1 + 0.95 * a3
    a0 = -0.3 + 0.95 * a1
    assert advantages[0].tolist() == pytest.approx([a0, a1, 0.0, a3, 0.0])
    assert returns[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.2, 0.0, 1.0, 0.0])


def test_gae_discount_and_kl_penalty() -> None:
    mask = torch.tensor([[1.0, 1.0]])
    kl = torch.tensor([[0.5, -1.0]])
    rewards = ppo.token_rewards(torch.tensor([2.0]), mask, kl, kl_coef=0.1)
    assert rewards[0].tolist() == pytest.approx([-0.05, 2.0 + 0.1])
    advantages, _ = ppo.gae(rewards, torch.zeros(1, 2), mask, gamma=0.5, lam=1.0)
    assert advantages[0].tolist() == pytest.approx([-0.05 + 0.5 * 2.1, 2.1])


def test_episode_without_policy_tokens_gets_nothing() -> None:
    mask = torch.zeros(1, 3)
    rewards = ppo.token_rewards(torch.tensor([3.0]), mask, None, 0.0)
    advantages, returns = ppo.gae(rewards, torch.ones(1, 3), mask, 1.0, 0.95)
    assert rewards.abs().sum() == 0 and advantages.abs().sum() == 0 and returns.abs().sum() == 0


def test_policy_loss_clips_asymmetrically_and_ignores_masked_tokens() -> None:
    old = torch.zeros(1, 4)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 100.0]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    result = ppo.policy_loss(ratios.log(), old, advantages, mask, clip_low=0.2, clip_high=0.28)
    # min(r A, clip(r, 0.8, 1.28) A) = [1.28, -0.8, 1.1]; loss is its negated sum over policy tokens.
    assert float(result.loss_sum) == pytest.approx(-(1.28 - 0.8 + 1.1))
    assert float(result.clip_fraction) == pytest.approx(2 / 3)
    assert float(result.approx_kl) == pytest.approx(-float((ratios[0, :3].log()).mean()))


def test_policy_loss_gradient_is_zero_where_clipped() -> None:
    logp = torch.tensor([[1.5, 1.1]]).log().requires_grad_(True)
    result = ppo.policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.28)
    result.loss_sum.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.1])


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_error() -> None:
    values = torch.tensor([[1.0, 0.0, 5.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, fraction = ppo.value_loss(values, old, returns, mask, clip=0.2)
    # clipped values [0.7, 0.3]; errors unclipped [1, 0], clipped [1.69, 0.09]
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.09))
    assert float(fraction) == pytest.approx(1.0)


def test_whiten_and_explained_variance() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    x = torch.tensor([[1.0, 2.0, 100.0, 3.0]])
    w = ppo.masked_whiten(x, mask)
    assert w[0, 2] == 0
    assert float(ppo.masked_mean(w, mask)) == pytest.approx(0.0, abs=1e-6)
    assert float(ppo.masked_mean(w**2, mask)) == pytest.approx(1.0, rel=1e-4)
    assert ppo.explained_variance(x, x, mask) == pytest.approx(1.0)
    assert ppo.explained_variance(torch.zeros_like(x), x, mask) == pytest.approx(0.0)


def test_micro_batches_respect_the_token_budget() -> None:
    lengths = [10, 50, 20, 20, 200, 5]
    groups = pack_micro_batches(lengths, token_budget=60)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for group in groups:
        padded = len(group) * max(lengths[i] for i in group)
        assert padded <= 60 or len(group) == 1
    assert [4] in groups  # longer than the budget: alone


def test_weight_sync_sends_buckets_and_awaits_coroutine_hooks() -> None:
    from cuda_agent.trainer.weight_sync import sync_weights

    class AsyncEngine:  # the rollout package's engines and router have an async update_weights
        def __init__(self) -> None:
            self.got: list[list[str]] = []

        async def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
            self.got.append([name for name, _ in bucket])

    buckets = [[("a", torch.zeros(4)), ("b", torch.zeros(4))], [("c", torch.zeros(8))]]
    engine = AsyncEngine()
    result = sync_weights(buckets, engine)
    assert engine.got == [["a", "b"], ["c"]]
    assert result["weight_sync_buckets"] == 2 and result["weight_sync_gb"] == pytest.approx(64 / 1e9)
