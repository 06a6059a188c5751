"""A scripted rollout for trainer tests: deterministic trajectories from (episode id, task, seed), no model
and no sandbox. A mock by necessity: the real agent loop needs a tokenizer with a chat template and a
sandbox server, which the tiny random-init model of these tests does not have (tests/agent covers that
loop; `AgentRollout` wires it in).

CUDA_AGENT_TEST_KILL_AT=STAGE:STEP:MARKER kills this process with SIGKILL in the weight sync after that
step's update (mid-step: learned in memory, not yet checkpointed), once: it first creates MARKER.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory
from cuda_agent.trainer.rollout import RolloutRequest

VOCAB = 64


class ScriptedRollout:
    def __init__(self, fail_at: tuple[str, int] | None = None) -> None:
        self.fail_at = fail_at
        self.last: tuple[str, int] | None = None
        self.synced_tensors = 0
        self.requests: list[RolloutRequest] = []

    async def generate(self, request: RolloutRequest) -> list[Trajectory]:
        self.requests.append(request)
        self.last = (request.stage, request.step)
        if self.fail_at == self.last:
            raise RuntimeError(f"scripted failure at {self.last}")
        return [
            scripted_trajectory(episode_id, task.name, request.seed + i, request.max_turns)
            for i, (task, episode_id) in enumerate(zip(request.tasks, request.episode_ids, strict=True))
        ]

    def update_weights(self, bucket: list[tuple[str, Any]]) -> None:
        self.synced_tensors += len(bucket)
        kill_at = os.environ.get("CUDA_AGENT_TEST_KILL_AT")
        if kill_at and self.last is not None:
            stage, step, marker = kill_at.split(":", 2)
            if self.last == (stage, int(step)) and not Path(marker).exists():
                Path(marker).write_text("killed")
                os.kill(os.getpid(), signal.SIGKILL)


def scripted_trajectory(episode_id: str, task: str, seed: int, max_turns: int) -> Trajectory:
    rng = random.Random(f"{task}:{seed}")
    prompt = [rng.randrange(VOCAB) for _ in range(6)]
    ids, mask = list(prompt), [0] * len(prompt)
    for turn in range(min(max_turns, 2)):
        generated = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 6))]
        ids += generated
        mask += [1] * len(generated)
        if turn + 1 < min(max_turns, 2):
            observation = [rng.randrange(VOCAB) for _ in range(4)]
            ids += observation
            mask += [0] * len(observation)
    reward = rng.choice([-1, 1, 1, 2, 3])
    return Trajectory(
        episode_id=episode_id,
        task_name=task,
        prompt_length=len(prompt),
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-1.5 * m for m in mask],
        reward=float(reward),
        verdict=JudgeVerdict(reward=reward, correct=reward >= 1),
        end="finished",
    )


def factory(run: Any, env: Any) -> ScriptedRollout:
    return ScriptedRollout()
