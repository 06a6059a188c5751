"""Tokens/s of one PPO training step (experience + actor and critic updates) for a 0.5B-class policy on
one GPU: cuda_agent.trainer's roles against a plain Hugging Face implementation of the same step, same
model shape, batch and GPU, same run.

  ours      ppo_step (cuda_agent.trainer.step) on PolicyActor / ValueCritic / Reference: log-probs,
            entropy and values from hidden states in checkpointed fp32 chunks, micro-batches packed by a
            token budget, right-padded micro-batches fed without an attention mask (causal attention never
            reaches the padding). Variants (--variants):
              masked-all  every layer checkpointed, attention mask passed: the trainer before 2026-12-01
              all         every layer checkpointed (selective: attention outputs kept)
              auto        spec.trainer.checkpointedLayers absent: the fewest checkpointed layers that fit
                          the GPU's free memory, chosen before each training micro-batch
  baseline  the models' own forward (full [tokens x vocab] logits, then fp32 log-softmax), transformers'
            gradient checkpointing, the same micro-batches with their attention masks; GAE and the loss
            formulas are the shared ones from cuda_agent.trainer.ppo (they are not what differs).
TRL's PPOTrainer doing the same step: bench/ppo_vs_trl.py (OpenRLHF: docs/performance.md says why not).

  PYTHONPATH=platform:trainer:sandbox_image python3 bench/ppo_throughput.py [--model 0.5b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from _trainer_common import device, is_oom, peak_gib, qwen2_config, reset_memory, run_spec, timed

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.trainer import ppo
from cuda_agent.trainer.experience import (
    MicroBatch,
    collate,
    episode_from_trajectory,
    gather,
    pack_micro_batches,
)
from cuda_agent.trainer.models import Critic, Policy, enable_checkpointing, set_attention_backend
from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic
from cuda_agent.trainer.sequence_parallel import ModelInputs, WholeSequence
from cuda_agent.trainer.step import compute_advantages, ppo_step


def trajectories(count: int, min_len: int, max_len: int, vocab: int) -> list[Trajectory]:
    """Agent-shaped episodes: a 512-token prompt, then 256-token turns separated by 128-token tool output."""
    rng = random.Random(0)
    out = []
    for i in range(count):
        n = rng.randint(min_len, max_len)
        mask = [0] * 512
        while len(mask) < n:
            mask += [1] * 256 + [0] * 128
        mask = mask[:n]
        out.append(
            Trajectory(
                episode_id=f"b{i}",
                task_name="bench",
                prompt_length=512,
                token_ids=[rng.randrange(vocab) for _ in range(n)],
                loss_mask=mask,
                logprobs=[-1.0 * m for m in mask],
                reward=float(rng.choice([-1, 1, 2, 3])),
                end="finished",
            )
        )
    return out


def build(model: str, max_len: int, critic: bool) -> Any:
    with torch.device(device()):
        auto = AutoModel if critic else AutoModelForCausalLM
        torch.manual_seed(1 if critic else 0)
        return auto.from_config(
            qwen2_config(model, max_len + 1), dtype=torch.bfloat16, attn_implementation="sdpa"
        )


class MaskedWholeSequence(WholeSequence):
    """The trainer's layout before 2026-12-01: padded micro-batches carry their attention mask."""

    def inputs(self, batch: MicroBatch) -> ModelInputs:
        return ModelInputs(batch.input_ids, batch.attention_mask)


VARIANTS: dict[str, dict[str, Any]] = {
    "masked-all": {"checkpointedLayers": 1000},
    "all": {"checkpointedLayers": 1000},
    "auto": {},
}


def ours(
    model: str, batch: list[Trajectory], budget: int, steps: int, backend: str, variant: str
) -> dict[str, Any]:
    spec = run_spec(
        microBatchTokens=budget, logitsChunkTokens=8192, attentionBackend=backend, **VARIANTS[variant]
    )
    set_attention_backend(spec.trainer)
    max_len = max(len(t.token_ids) for t in batch)
    lm, ref, backbone = (
        build(model, max_len, False),
        build(model, max_len, False),
        build(model, max_len, True),
    )
    enable_checkpointing(lm, spec.trainer)
    enable_checkpointing(backbone, spec.trainer)
    actor = PolicyActor(spec, device(), Policy(lm, 8192))
    critic = ValueCritic(spec, device(), Critic(backbone, backbone.config.hidden_size).to(device()))
    reference = Reference(spec, device(), Policy(ref, 8192))
    if variant.startswith("masked"):
        for role in (actor, critic, reference):
            role.layout = MaskedWholeSequence()
    chosen: list[list[int]] = []

    def step(seed: int) -> None:
        ppo_step(batch, actor, critic, reference, spec, step_seed=seed)
        chosen.append([actor.layer_plan.count, critic.layer_plan.count])

    times = [timed(lambda s=s: step(s))[0] for s in range(steps)]
    # checkpointed layers (actor, critic) after each step's last micro-batch
    return {"times": times, "checkpointed_layers": chosen}


def baseline(model: str, batch: list[Trajectory], budget: int, steps: int) -> list[float]:
    spec = run_spec(microBatchTokens=budget)
    a, t = spec.algorithm, spec.trainer
    dev = device()
    max_len = max(len(tr.token_ids) for tr in batch)
    lm, ref, backbone = (
        build(model, max_len, False),
        build(model, max_len, False),
        build(model, max_len, True),
    )
    for m in (lm, backbone):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    head = nn.Linear(backbone.config.hidden_size, 1, dtype=torch.bfloat16, device=dev)
    actor_opt = torch.optim.AdamW(
        lm.parameters(), lr=a.actor_learning_rate, betas=(0.9, 0.95), weight_decay=0
    )
    critic_params = [*backbone.parameters(), *head.parameters()]
    critic_opt = torch.optim.AdamW(
        critic_params, lr=a.critic_learning_rate, betas=(0.9, 0.95), weight_decay=0
    )

    def logprobs(model_: Any, mb: Any) -> torch.Tensor:
        logits = model_(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]

    def values(mb: Any) -> torch.Tensor:
        h = backbone(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state
        return head(h).squeeze(-1).float()[:, :-1]

    def step(seed: int) -> None:
        episodes = [episode_from_trajectory(tr) for tr in batch]
        groups = pack_micro_batches([e.length for e in episodes], t.micro_batch_tokens)
        mbs = [collate(episodes, g, dev) for g in groups]
        with torch.no_grad():
            lm.eval()
            backbone.eval()
            for mb in mbs:
                old, rl, v = logprobs(lm, mb), logprobs(ref, mb), values(mb) * mb.mask
                for row, i in enumerate(mb.indices):
                    n = episodes[i].length - 1
                    episodes[i].old_logprobs = old[row, :n].cpu()
                    episodes[i].ref_logprobs = rl[row, :n].cpu()
                    episodes[i].values = v[row, :n].cpu()
        compute_advantages(episodes, spec)
        n_tokens = sum(float(e.mask.sum()) for e in episodes)
        lm.train()
        for mb in mbs:
            res = ppo.policy_loss(
                logprobs(lm, mb),
                gather(episodes, mb, "old_logprobs"),
                gather(episodes, mb, "advantages"),
                mb.mask,
                a.clip_low,
                a.clip_high,
            )
            (res.loss_sum / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), t.max_grad_norm)
        actor_opt.step()
        actor_opt.zero_grad(set_to_none=True)
        backbone.train()
        for mb in mbs:
            loss, _ = ppo.value_loss(
                values(mb),
                gather(episodes, mb, "values"),
                gather(episodes, mb, "returns"),
                mb.mask,
                t.value_clip,
            )
            (loss / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(critic_params, t.max_grad_norm)
        critic_opt.step()
        critic_opt.zero_grad(set_to_none=True)

    return {"times": [timed(lambda s=s: step(s))[0] for s in range(steps)]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="0.5b")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--budget", type=int, default=32_768, help="micro-batch token budget (both)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--variants", default="masked-all,all,auto", help=", ".join(VARIANTS))
    parser.add_argument("--backends", default="auto", help="spec.trainer.attentionBackend values")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    vocab = qwen2_config(args.model, 16).vocab_size
    batch = trajectories(args.episodes, args.min_len, args.max_len, vocab)
    tokens = sum(len(t.token_ids) for t in batch)
    rows: list[dict[str, Any]] = []
    runs = [("baseline plain HF", lambda b: baseline(args.model, batch, b, args.steps))]
    runs += [
        (
            f"ours ({v}, attention {k})",
            lambda b, k=k, v=v: ours(args.model, batch, b, args.steps, k, v),
        )
        for v in args.variants.split(",")
        for k in args.backends.split(",")
    ]
    for label, fn in runs:
        budget = args.budget
        while True:
            reset_memory()
            try:
                result = fn(budget)
                times = result["times"]
                rows.append(
                    {
                        "run": label,
                        "budget": budget,
                        "step_s": [round(x, 2) for x in times],
                        "tokens_per_s": round(tokens / min(times)),
                        "peak_gib": round(peak_gib(), 1),
                        **(
                            {"checkpointed": result["checkpointed_layers"]}
                            if "checkpointed_layers" in result
                            else {}
                        ),
                    }
                )
                break
            except Exception as exc:
                if not is_oom(exc) or budget <= 4096:
                    raise
                rows.append({"run": label, "budget": budget, "status": "out of memory"})
                budget //= 2
        print(json.dumps(rows[-1]), flush=True)
    base = next(r for r in rows if r["run"].startswith("baseline") and "tokens_per_s" in r)
    best = max(
        (r for r in rows if r["run"].startswith("ours") and "tokens_per_s" in r),
        key=lambda r: r["tokens_per_s"],
    )
    summary = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": args.model,
        "episodes": args.episodes,
        "tokens_per_step": tokens,
        "best": best["run"],
        "ratio": round(best["tokens_per_s"] / base["tokens_per_s"], 3),
    }
    rows.append(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ppo_throughput.json").write_text(json.dumps(rows, indent=1))
    print(
        "\n| run | micro-batch tokens | step s | tokens/s | vs baseline | peak GiB | checkpointed |"
        "\n|---|---|---|---|---|---|---|"
    )
    for r in rows[:-1]:
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}" if "tokens_per_s" in r else ""
        print(
            f"| {r['run']} | {r['budget']} | {r.get('step_s', 'OOM')} | {r.get('tokens_per_s', '')} "
            f"| {ratio} | {r.get('peak_gib', '')} | {r.get('checkpointed', '')} |"
        )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
