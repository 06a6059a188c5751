"""One PPO step of the trainer's roles equals a plain reference implementation written here, for the
plain-torch engine and for DeepSpeed ZeRO stages 0-3 (CPU, gloo, one process).

The reference uses full logits from the model call, per-episode Python loops for GAE and one
`torch.optim.AdamW` step: nothing from cuda_agent.trainer but the model builders.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.trainingrun import TrainingRun, TrainingRunSpec
from cuda_agent.trainer.models import Critic, Policy, build_critic, build_policy, build_reference
from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic
from cuda_agent.trainer.step import ppo_step

VOCAB = 64  # the tiny model of conftest.py


def make_trajectories(count: int, seed: int = 0) -> list[Trajectory]:
    """Episodes with a prompt, then generated turns separated by tool output (mask 0)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n, prompt = rng.randint(14, 30), 5
        mask = [0] * prompt + [1 if (j // 4) % 2 == 0 else 0 for j in range(n - prompt)]
        out.append(
            Trajectory(
                episode_id=f"e{seed}-{i}",
                task_name=f"task{i}",
                prompt_length=prompt,
                token_ids=[rng.randrange(VOCAB) for _ in range(n)],
                loss_mask=mask,
                logprobs=[-2.0 * m for m in mask],
                reward=float(rng.choice([-1, 1, 2, 3])),
                end="finished",
            )
        )
    return out


def reference_ppo_step(
    policy_wrapper: Policy,
    critic: Critic,
    ref_wrapper: Policy,
    trajectories: list[Trajectory],
    spec: TrainingRunSpec,
) -> None:
    a, t = spec.algorithm, spec.trainer
    rows = []
    policy, ref = (
        policy_wrapper.lm,
        ref_wrapper.lm,
    )  # plain Hugging Face models: full logits from the model call
    with torch.no_grad():
        for tr in trajectories:
            ids = torch.tensor([tr.token_ids])
            old = torch.log_softmax(policy(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
            ref_lp = torch.log_softmax(ref(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
            values = critic(ids)[0, :-1]
            rows.append(
                (ids, torch.tensor(tr.loss_mask[1:], dtype=torch.float32), old, ref_lp, values, tr.reward)
            )
    advantages, returns = [], []
    for _, mask, old, ref_lp, values, reward in rows:
        positions = [j for j in range(len(mask)) if mask[j] == 1]
        rewards = {j: -a.kl_coef * float(old[j] - ref_lp[j]) for j in positions}
        rewards[positions[-1]] += reward
        adv, ret = torch.zeros(len(mask)), torch.zeros(len(mask))
        running, next_value = 0.0, 0.0
        for j in reversed(positions):
            delta = rewards[j] + a.gamma * next_value - float(values[j])
            running = delta + a.gamma * a.gae_lambda * running
            adv[j], ret[j], next_value = running, running + float(values[j]), float(values[j])
        advantages.append(adv)
        returns.append(ret)
    flat = torch.cat([adv[mask > 0] for adv, (_, mask, *_r) in zip(advantages, rows, strict=True)])
    mean, std = flat.mean(), (flat.var(unbiased=False) + 1e-8).sqrt()
    advantages = [(adv - mean) / std for adv in advantages]
    total = sum(float(r[1].sum()) for r in rows)

    policy.train()
    opt = torch.optim.AdamW(
        policy.parameters(), lr=a.actor_learning_rate, betas=(0.9, 0.95), eps=1e-8, weight_decay=0
    )
    loss = torch.zeros(())
    for (ids, mask, old, *_), adv in zip(rows, advantages, strict=True):
        logp = torch.log_softmax(policy(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
        ratio = torch.exp(logp - old)
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - a.clip_low, 1 + a.clip_high) * adv)
        loss = loss - (surrogate * mask).sum() / total
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(policy.parameters(), t.max_grad_norm)
    opt.step()

    critic.train()
    opt = torch.optim.AdamW(
        critic.parameters(), lr=a.critic_learning_rate, betas=(0.9, 0.95), eps=1e-8, weight_decay=0
    )
    loss = torch.zeros(())
    for (ids, mask, _, _, old_values, _), ret in zip(rows, returns, strict=True):
        v = critic(ids)[0, :-1]
        v_clip = old_values + (v - old_values).clamp(-t.value_clip, t.value_clip)
        loss = loss + (0.5 * torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2) * mask).sum() / total
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(critic.parameters(), t.max_grad_norm)
    opt.step()


def full_params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


@pytest.fixture(scope="module")
def reference_result(
    run_document: Callable[..., dict[str, Any]],
) -> tuple[TrainingRunSpec, dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    spec = TrainingRun.model_validate(run_document()).spec
    torch.manual_seed(1)
    policy, critic = build_policy(spec.model, spec.trainer), build_critic(spec.model, spec.trainer)
    ref = build_reference(spec.model, spec.trainer)
    initial = {"policy": copy.deepcopy(policy), "critic": copy.deepcopy(critic), "ref": ref}
    reference_ppo_step(policy, critic, ref, make_trajectories(6), spec)
    return spec, full_params(policy), full_params(critic), initial


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], initial: nn.Module) -> None:
    start = dict(initial.named_parameters())
    moved = 0
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-6, msg=name)
        moved += int(not torch.equal(value, start[name]))
    assert moved > len(want) // 2  # the step really changed the weights


def roles_step(
    spec: TrainingRunSpec, initial: dict[str, Any]
) -> tuple[PolicyActor, ValueCritic, dict[str, float]]:
    actor = PolicyActor(spec, torch.device("cpu"), copy.deepcopy(initial["policy"]))
    critic = ValueCritic(spec, torch.device("cpu"), copy.deepcopy(initial["critic"]))
    reference = Reference(spec, torch.device("cpu"), initial["ref"])
    metrics = ppo_step(make_trajectories(6), actor, critic, reference, spec, step_seed=0)
    return actor, critic, metrics


def test_ppo_step_equals_plain_reference(reference_result: Any) -> None:
    spec, want_policy, want_critic, initial = reference_result
    actor, critic, metrics = roles_step(spec, initial)
    assert_close(full_params(actor.module), want_policy, initial["policy"])
    assert_close(full_params(critic.engine.module), want_critic, initial["critic"])
    for key in (
        "reward",
        "pass_rate",
        "entropy",
        "clip_fraction",
        "kl",
        "explained_variance",
        "response_length",
        "experience_s",
        "actor_update_s",
        "train_tokens_per_s_per_gpu",
    ):
        assert key in metrics
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the update
    assert metrics["response_length"] > 0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_zero_stage_equals_plain_reference(stage: int, reference_result: Any) -> None:
    spec, want_policy, want_critic, initial = reference_result
    spec = spec.model_copy(
        update={"trainer": spec.trainer.model_copy(update={"engine": "deepspeed", "zero_stage": stage})}
    )
    actor, critic, _ = roles_step(spec, initial)
    params = list(actor.module.parameters())
    with actor.engine.gathered(params):
        got_policy = full_params(actor.module)
    with critic.engine.gathered(list(critic.engine.module.parameters())):
        got_critic = full_params(critic.engine.module)
    assert_close(got_policy, want_policy, initial["policy"])
    assert_close(got_critic, want_critic, initial["critic"])
