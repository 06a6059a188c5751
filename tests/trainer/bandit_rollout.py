"""A policy-dependent rollout for the learning tests: the tiny policy itself samples two short turns around a
tool observation, and a milestone-style reward counts a target token in what it sampled.

A stand-in by necessity: the real agent loop needs a tokenizer with a chat template and a sandbox whose judge
can be passed, which a 64-token random model cannot reach (tests/agent covers that loop). Everything the
trainer touches is real: sampling from the rollout's own copy of the policy, log-probs of the sampled
tokens, weight sync into that copy, resume.

The observation is adversarial on purpose: when the first turn missed the target, the "tool" answers with
the target token repeated (an error message quoting what was expected). A trainer that learned from tool
output (a dropped action mask) would push those tokens down in punished episodes and unlearn the target.

CUDA_AGENT_TEST_KILL_AT=STAGE:STEP:MARKER kills the process with SIGKILL during the weight sync after that
step's update, once (MARKER is created first). CUDA_AGENT_TEST_SYNC_LOG=PATH appends, after every complete
weight sync, one JSON line with the digest of the rollout's weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.trainer.rollout import RolloutRequest
from cuda_agent.trainer.weight_sync import NamedTensors, load_bucket

TARGET = 7  # the rewarded token
TURN_TOKENS = 4
OBSERVATION_TOKENS = 8
PROMPT_TOKENS = 4


def milestone(count: int) -> int:
    """-1 without the target, then 1 / 2 / 3 as it appears more often (the judge's scale)."""
    return -1 if count == 0 else 1 if count <= 2 else 2 if count <= 4 else 3


def weights_digest(named: list[tuple[str, torch.Tensor]]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


class BanditRollout:
    def __init__(self, run: TrainingRun, vocab: int) -> None:
        from cuda_agent.trainer.models import load_pretrained

        spec = run.spec
        self.vocab = vocab
        self.model = load_pretrained(AutoModelForCausalLM, spec.model, spec.model.base, spec.trainer)
        self.model.train(False)
        self.last: tuple[str, int] | None = None
        self.tensors_seen = 0
        self.parameters = len(list(self.model.named_parameters()))

    @torch.no_grad()
    def _turn(self, ids: list[int], generator: torch.Generator) -> tuple[list[int], list[float]]:
        tokens, logps = [], []
        for _ in range(TURN_TOKENS):
            logits = self.model(torch.tensor([ids + tokens])).logits[0, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            tokens.append(token)
            logps.append(float(logp[token]))
        return tokens, logps

    def episode(self, episode_id: str, task: str, seed: int) -> Trajectory:
        generator = torch.Generator().manual_seed(seed)
        prompt = [int(x) for x in torch.randint(8, self.vocab, (PROMPT_TOKENS,), generator=generator)]
        first, first_logp = self._turn(prompt, generator)
        hint = TARGET if TARGET not in first else 1  # the adversarial observation, see the module doc
        observation = [hint] * OBSERVATION_TOKENS
        second, second_logp = self._turn(prompt + first + observation, generator)
        ids = prompt + first + observation + second
        mask = [0] * PROMPT_TOKENS + [1] * TURN_TOKENS + [0] * OBSERVATION_TOKENS + [1] * TURN_TOKENS
        logprobs = [0.0] * PROMPT_TOKENS + first_logp + [0.0] * OBSERVATION_TOKENS + second_logp
        reward = milestone((first + second).count(TARGET))
        return Trajectory(
            episode_id=episode_id,
            task_name=task,
            prompt_length=PROMPT_TOKENS,
            token_ids=ids,
            loss_mask=mask,
            logprobs=logprobs,
            reward=float(reward),
            verdict=JudgeVerdict(reward=reward, correct=reward >= 1),
            end="finished",
        )

    async def generate(self, request: RolloutRequest) -> list[Trajectory]:
        self.last = (request.stage, request.step)
        return [
            self.episode(episode_id, task.name, request.seed + i)
            for i, (task, episode_id) in enumerate(zip(request.tasks, request.episode_ids, strict=True))
        ]

    def update_weights(self, bucket: NamedTensors) -> None:
        load_bucket(self.model, bucket)
        self.tensors_seen += len(bucket)
        if self.tensors_seen % self.parameters == 0:
            self._after_full_sync()

    def _after_full_sync(self) -> None:
        log = os.environ.get("CUDA_AGENT_TEST_SYNC_LOG")
        if log:
            with open(log, "a") as out:
                digest = weights_digest(list(self.model.named_parameters()))
                out.write(json.dumps({"after": self.last, "digest": digest, "pid": os.getpid()}) + "\n")
        kill_at = os.environ.get("CUDA_AGENT_TEST_KILL_AT")
        if kill_at and self.last is not None:
            stage, step, marker = kill_at.split(":", 2)
            if self.last == (stage, int(step)) and not Path(marker).exists():
                Path(marker).write_text("killed")
                os.kill(os.getpid(), signal.SIGKILL)


def factory(run: Any, env: Any) -> BanditRollout:
    import json as _json

    config = _json.loads((Path(run.spec.model.base) / "config.json").read_text())
    return BanditRollout(run, int(config["vocab_size"]))
