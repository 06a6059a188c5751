"""Learning as a tested property (docs/trainer.md, "Does it learn?").

1. One PPO step makes rewarded actions more likely: token A earns 3 and token B earns -1, with tool output
   between the policy's turns that says the opposite; the step must raise log p(A) - log p(B) at every
   policy position (and lower it with the rewards swapped).
2. The whole trainer learns a policy-dependent reward: `cuda-agent train` with a rollout in which the
   policy's own samples decide the reward, killed with SIGKILL mid-run and resumed; the last steps' reward
   beats the first steps' by a stated margin, and after the resume the rollout holds the actor's weights.
3. RFT fits the kept trajectories' policy tokens (not the tool output between them), and the KL reference
   becomes the actor RFT produced.

Each fails against a copy of the trainer with the policy-loss sign flipped or the action mask dropped
(checked by hand; docs/trainer.md gives the numbers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from bandit_rollout import weights_digest  # tests/trainer is on sys.path (rootdir conftest)
from scripted_rollout import ScriptedRollout

from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory
from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainerSpec, TrainingRun
from cuda_agent.runstatus import FileStatusWriter
from cuda_agent.trainer.checkpoint import CheckpointStore, TrainerState
from cuda_agent.trainer.data import TaskOrder, load_tasks
from cuda_agent.trainer.driver import Trainer
from cuda_agent.trainer.experience import episode_from_trajectory
from cuda_agent.trainer.report import StepRewards, reward_trend
from cuda_agent.trainer.roles import PolicyActor, ValueCritic
from cuda_agent.trainer.step import ppo_step
from cuda_agent.trainer.workers import LocalWorkers

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
A, B = 10, 11
DEFAULT_MINI_BATCHES = TrainerSpec().mini_batches  # the tiny-model fixture pins 1; learning runs the default
PROMPT = [1, 2, 3, 4]


def direction_episode(index: int, token: int, other: int, reward: float) -> Trajectory:
    """prompt, a turn of `token`, tool output of `other` (masked), a second turn of `token`."""
    turn, observation = [token] * 3, [other] * 12
    ids = PROMPT + turn + observation + turn
    mask = [0] * len(PROMPT) + [1] * 3 + [0] * 12 + [1] * 3
    return Trajectory(
        episode_id=f"e{index}",
        task_name="bandit",
        prompt_length=len(PROMPT),
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-4.0 * m for m in mask],
        reward=reward,
        verdict=JudgeVerdict(reward=int(reward), correct=reward >= 1),
        end="finished",
    )


def preference(actor: PolicyActor, trajectories: list[Trajectory]) -> torch.Tensor:
    """log p(A) - log p(B) at every policy position of every episode (position j predicts token j + 1)."""
    out = []
    with torch.no_grad():
        for t in trajectories:
            episode = episode_from_trajectory(t)
            logits = actor.module.lm(episode.input_ids[None]).logits[0, :-1].float()  # type: ignore[union-attr,operator]
            logp = torch.log_softmax(logits, dim=-1)
            positions = episode.mask.nonzero().squeeze(1)
            out.append(logp[positions, A] - logp[positions, B])
    return torch.cat(out)


@pytest.mark.parametrize("a_reward, b_reward", [(3.0, -1.0), (-1.0, 3.0)])
def test_one_ppo_step_moves_probability_toward_the_rewarded_token(
    run_document: Callable[..., dict[str, Any]], a_reward: float, b_reward: float
) -> None:
    run = TrainingRun.model_validate(
        run_document(
            algorithm={"klCoef": 0.0, "actorLearningRate": 3e-3, "criticLearningRate": 1e-3},
            trainer={"miniBatches": DEFAULT_MINI_BATCHES},
        )
    )
    torch.manual_seed(0)
    actor, critic = PolicyActor(run.spec), ValueCritic(run.spec)
    batch = [direction_episode(i, A, B, a_reward) for i in range(4)]
    batch += [direction_episode(4 + i, B, A, b_reward) for i in range(4)]
    before = preference(actor, batch)
    metrics = ppo_step(batch, actor, critic, None, run.spec, step_seed=1)
    change = preference(actor, batch) - before
    sign = 1.0 if a_reward > b_reward else -1.0
    # Every policy position, both episode kinds, moves the right way by a clear margin.
    assert (sign * change).min().item() > 0.05, change
    assert metrics["policy_tokens"] > 0


def bandit_spec(tiny_model_dir: Path) -> dict[str, Any]:
    return {
        "model": {"base": str(tiny_model_dir)},
        "dataset": {"uri": str(TASKS)},
        "algorithm": {
            "steps": 24,
            "batchSize": 16,
            "klCoef": 0.0,
            "actorLearningRate": 3e-3,
            "criticLearningRate": 3e-3,
        },
        "warmup": {
            "singleTurnPpo": {"enabled": False, "maxContextTokens": 1024},
            "rft": {"enabled": False},
            "valuePretraining": {"enabled": False},
        },
        "agent": {"maxContextTokens": 1024},
        "trainer": {"miniBatches": DEFAULT_MINI_BATCHES},
        "checkpoint": {"everySteps": 4, "keep": 10},  # the resumed one is still there to compare
    }


def test_trainer_raises_a_policy_dependent_reward_through_a_kill_and_resume(
    run_document: Callable[..., dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(run_document(**bandit_spec(tiny_model_dir))))
    sync_log = tmp_path / "syncs.jsonl"
    env = {
        **os.environ,
        **TrainerEnv(
            run_name="tiny",
            checkpoint_prefix=str(tmp_path / "ckpt"),
            status_mode="file",
            status_file=str(tmp_path / "status.jsonl"),
        ).to_environ(),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        # Killed in the sync after PPO step 11 (index 10): learned in memory, checkpointed at step 8.
        "CUDA_AGENT_TEST_KILL_AT": f"ppo:10:{tmp_path / 'killed'}",
        "CUDA_AGENT_TEST_SYNC_LOG": str(sync_log),
    }
    command = [sys.executable, "-m", "cuda_agent.cli", "train", "-f", str(run_file)]
    command += ["--rollout", "bandit_rollout:factory"]
    first = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == -9, first.stderr[-3000:]
    second = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed_from = re.search(r"resumed from (\S+) at ppo step 8\b", second.stderr)
    assert resumed_from is not None, second.stderr[-3000:]

    # After the resume the rollout's first full sync (before any rollout) holds the checkpoint's actor.
    syncs = [json.loads(line) for line in sync_log.read_text().splitlines()]
    second_pid = syncs[-1]["pid"]
    resumed = next(s for s in syncs if s["pid"] == second_pid)
    assert resumed["after"] is None, "the resumed trainer rolled out before syncing its weights"
    checkpoint = Path(resumed_from.group(1)) / "actor" / "state.pt"
    module = torch.load(checkpoint, map_location="cpu", weights_only=True)["module"]
    actor_weights = [(name.removeprefix("lm."), tensor) for name, tensor in module.items()]
    assert resumed["digest"] == weights_digest(actor_weights)

    latest = (tmp_path / "ckpt" / "latest").read_text()
    state = TrainerState.model_validate_json((tmp_path / "ckpt" / latest / "state.json").read_text())
    ppo = [h for h in state.history if h["stage"] == "ppo"]
    assert [h["step"] for h in ppo] == list(range(1, 25))
    rewards = [h["reward"] for h in ppo]
    first_k, last_k = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    # Stated margin: one milestone level (e.g. from mostly -1 to mostly >= 0) over 24 steps of 16 episodes.
    assert last_k - first_k >= 1.0, rewards
    steps = [StepRewards(h["reward"], h["reward_std"], int(h["episodes_learned"])) for h in ppo]
    assert reward_trend(steps)["rose"] is True
    summary = json.loads((tmp_path / "ckpt" / "report" / "summary.json").read_text())
    assert summary["ppo_reward_trend"]["verdict"].startswith("rose")


def demonstration(index: int, task: str, reward: float) -> Trajectory:
    """A warm-up trajectory: a task-specific prompt and policy turn, noisy tool output, a second turn. The
    prompt names the task and whether it failed, so a critic can predict the reward from it."""
    generator = torch.Generator().manual_seed(index)
    prompt = [1, 2, 3, (8 + index % 4) if reward > 0 else 30]
    turn = [12 + (index % 4) * 3 + j for j in range(6)]
    observation = [int(x) for x in torch.randint(40, 64, (10,), generator=generator)]
    ids = prompt + turn + observation + turn[::-1]
    mask = [0] * 4 + [1] * 6 + [0] * 10 + [1] * 6
    return Trajectory(
        episode_id=f"demo-{index}",
        task_name=task,
        prompt_length=4,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        reward=reward,
        verdict=JudgeVerdict(reward=int(reward), correct=reward >= 1),
        end="finished",
    )


def token_nll(lm: Any, trajectories: list[Trajectory], policy: bool) -> float:
    """Mean NLL under the Hugging Face model `lm` of the policy tokens (policy=True) or of the tool-output
    tokens after the prompt (policy=False)."""
    total, count = 0.0, 0.0
    with torch.no_grad():
        for t in trajectories:
            e = episode_from_trajectory(t)
            logits = lm(e.input_ids[None]).logits[0, :-1].float()
            nll = -torch.log_softmax(logits, -1).gather(1, e.input_ids[1:, None]).squeeze(1)
            after_prompt = (torch.arange(nll.numel()) >= t.prompt_length - 1).float()
            policy_mask = torch.tensor(
                t.loss_mask[1:], dtype=torch.float32
            )  # the record's, not the trainer's
            mask = policy_mask if policy else (1 - policy_mask) * after_prompt
            total += float((nll * mask).sum())
            count += float(mask.sum())
    return total / count


def test_rft_fits_the_kept_policy_tokens_and_moves_the_reference(
    run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    spec = {
        "dataset": {"uri": str(TASKS)},
        "algorithm": {"steps": 1, "batchSize": 2, "klCoef": 0.1},
        "warmup": {
            "singleTurnPpo": {"enabled": False, "maxContextTokens": 1024},
            "rft": {"enabled": True, "epochs": 10, "learningRate": 3e-3, "miniBatchEpisodes": 2},
            "valuePretraining": {
                "enabled": True,
                "maxEpochs": 30,
                "miniBatchEpisodes": 2,
                "learningRate": 3e-3,
            },
        },
        "agent": {"maxContextTokens": 1024},
    }
    run = TrainingRun.model_validate(run_document(**spec))
    kept = [demonstration(i, f"task{i % 4}", [1.0, 2.0, 3.0, 1.0][i % 4]) for i in range(8)]
    dropped = [demonstration(8 + i, "failed", -1.0) for i in range(4)]  # below minReward: never learned
    trainer = Trainer(
        run=run,
        rollout=ScriptedRollout(),
        workers=LocalWorkers.build(run.spec),
        status=FileStatusWriter(str(tmp_path / "status.jsonl")),
        checkpoints=CheckpointStore(str(tmp_path / "ckpt"), keep=2),
        order=TaskOrder(load_tasks(run.spec.dataset.uri), run.spec.trainer.seed),
        rft_source=kept + dropped,
    )
    workers = trainer.workers
    assert isinstance(workers, LocalWorkers) and workers.reference is not None
    base = workers.reference.module.lm
    policy_before = token_nll(base, kept, policy=True)
    observation_before = token_nll(base, kept, policy=False)
    state = trainer.train()

    rft = [h for h in state.history if h["stage"] == "rft"]
    assert len(rft) == 10 and all(h["rft_kept"] == 8 for h in rft)
    assert rft[0]["optimizer_steps"] == 4  # 8 kept / 2 per step
    assert rft[0]["nll_before"] == pytest.approx(policy_before, rel=1e-4)
    # Stated margin: the kept policy tokens' NLL falls to under a third of where it started.
    assert rft[-1]["nll_after"] < policy_before / 3, (policy_before, rft[-1]["nll_after"])
    # The KL reference is the actor as RFT left it (PPO has moved the actor on since): it fits the kept
    # policy tokens as RFT's last epoch did ...
    reference = workers.reference.module.lm
    assert token_nll(reference, kept, policy=True) == pytest.approx(rft[-1]["nll_after"], rel=1e-4)
    # ... and RFT did not learn the tool output between them (it may drift, it must not fall like the
    # policy tokens did).
    observation_after = token_nll(reference, kept, policy=False)
    assert observation_after > observation_before - 0.5, (observation_before, observation_after)

    # Value pretraining fitted the critic to the kept rewards and stopped by itself or at its bound.
    value = [h for h in state.history if h["stage"] == "value_pretraining"]
    assert value[-1]["explained_variance"] > value[0]["explained_variance_before"] + 0.3, [
        (round(h["explained_variance"], 3), round(h["value_error"], 3)) for h in value
    ]
    assert len(value) <= 30, len(value)

    summary = json.loads((tmp_path / "ckpt" / "report" / "summary.json").read_text())
    assert summary["warmup"]["rft"]["nll_after"] == pytest.approx(rft[-1]["nll_after"])
    status = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    assert any("nll" in s["progress"]["message"] and "->" in s["progress"]["message"] for s in status)
