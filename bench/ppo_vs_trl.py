"""Tokens/s of one PPO training step: cuda_agent.trainer against TRL's PPOTrainer doing the same step on the
same model shape, batch and GPU, in the same run.

TRL: 1.12.0 is the newest release with a PPO trainer that trains a value model (`trl.experimental.ppo`;
1.13.0 and later ship none, 0.x had it as `trl.PPOTrainer`). Wheels: trl, datasets, dill, multiprocess.

What runs on each side, per step, over the same 32 agent-shaped episodes (bench/ppo_throughput.py):
  ours  ppo_step: actor, reference and critic forwards for the experience, GAE, one actor and one critic
        optimizer step over every episode (spec.trainer.checkpointedLayers absent: auto).
  TRL   one iteration of PPOTrainer.train(), unmodified, with num_ppo_epochs=1 and num_mini_batches=1 (one
        optimizer step over every episode, policy and value together, as TRL does): its reference and
        value forwards, its reward-model call, GAE, whitening, the update and its metrics. Generation is
        taken out: trl's `batch_generation` is replaced by a function that returns the premade episodes
        (prompt, then the trajectory's tokens as the "response"), and, in place of the logits generation
        would have returned, a policy forward run (no grad, in TRL's own `forward`, chunk by chunk, cast to
        fp32 as generate's scores are) where TRL reads them: the old-logprob forward ours runs too.
        The reward model is a 1-layer, 64-wide Qwen2 (ours takes rewards from the judge; TRL needs a model).
        PPOConfig's gradient_checkpointing=True default is applied to policy and value by this script,
        since PPOTrainer (unlike Trainer.train) never applies it.
TRL pads every episode of the batch to the longest (fixed-shape rollout tensors); tokens/s counts the
batch's real tokens on both sides. Micro-batches: ours packs up to --budget padded tokens; TRL takes
--budget // padded-episode-length episodes per micro-batch (per_device_train_batch_size and
local_rollout_forward_batch_size).

  PYTHONPATH=platform:trainer:sandbox_image python3 bench/ppo_vs_trl.py [--model 0.5b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config, TrainerCallback

sys.path.insert(0, str(Path(__file__).parent))
from _trainer_common import device, is_oom, peak_gib, qwen2_config, reset_memory, sync
from ppo_throughput import build, ours, trajectories

from cuda_agent.agent.trajectory import Trajectory

PROMPT = 512  # every bench trajectory starts with a 512-token prompt


class PolicyLogits:
    """Stands in for the stacked generation scores TRL slices per rollout chunk: each slice runs the policy
    forward over those episodes (TRL's own `forward`), keeps the response positions, divides by the
    temperature as generate's logits processor does, and returns fp32 as generate's scores are."""

    def __init__(self, trl_ppo: Any, policy: Any, query_responses: torch.Tensor, pad: int, temp: float):
        self.trl_ppo, self.policy, self.qr, self.pad, self.temp = trl_ppo, policy, query_responses, pad, temp

    def __getitem__(self, rows: slice) -> torch.Tensor:
        out = self.trl_ppo.forward(self.policy, self.qr[rows], self.pad)
        logits: torch.Tensor = out.logits[:, PROMPT - 1 : -1].float() / self.temp
        return logits


class StepTimes(TrainerCallback):
    """Wall time of each PPOTrainer update (on_step_end follows the optimizer step and the metrics)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.last = 0.0

    def _now(self) -> float:
        sync()
        return time.perf_counter()

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        self.last = self._now()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        now = self._now()
        self.times.append(now - self.last)
        self.last = now


class TokenIds:
    """The two ids PPOTrainer reads from its processing class (the collator is given, so no tokenizer)."""

    def __init__(self, vocab: int) -> None:
        self.pad_token_id, self.eos_token_id = vocab - 1, vocab - 2


def trl_step(model: str, batch: list[Trajectory], budget: int, steps: int) -> dict[str, Any]:
    import trl
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    dev = device()
    max_len = max(len(t.token_ids) for t in batch)
    config = qwen2_config(model, max_len + 1)
    ids = TokenIds(config.vocab_size)
    response_len = max_len - PROMPT
    rows = max(1, budget // max_len)
    while len(batch) % rows:
        rows -= 1
    # the pad id marks padding for TRL, so no real token may carry it (which id a token has costs nothing)
    tokens = [[0 if x == ids.pad_token_id else x for x in t.token_ids] for t in batch]
    assert all(t.prompt_length == PROMPT for t in batch)
    responses = {
        torch.tensor(t[:PROMPT]).numpy().tobytes(): t[PROMPT:] + [ids.pad_token_id] * (max_len - len(t))
        for t in tokens
    }
    assert len(responses) == len(batch), "prompts must tell the episodes apart"
    temperature = 1.0

    def premade(policy: Any, queries: torch.Tensor, *_: Any) -> tuple[torch.Tensor, PolicyLogits]:
        rest = [responses[q.cpu().numpy().tobytes()] for q in queries]
        qr = torch.cat((queries, torch.tensor(rest, device=queries.device)), 1)
        return qr, PolicyLogits(trl_ppo, policy, qr, ids.pad_token_id, temperature + 1e-7)

    trl_ppo.batch_generation = premade
    policy, ref = build(model, max_len, False), build(model, max_len, False)
    config.num_labels = 1
    reward_config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=config.vocab_size,
        max_position_embeddings=max_len + 1,
        use_cache=False,
    )
    reward_config.num_labels = 1
    auto: Any = AutoModelForSequenceClassification
    with torch.device(dev):
        torch.manual_seed(1)
        value = auto.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        reward = auto.from_config(reward_config, dtype=torch.bfloat16, attn_implementation="sdpa")
    for m in (policy, value):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        args = PPOConfig(
            output_dir=out,
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=len(batch) // rows,
            local_rollout_forward_batch_size=rows,
            num_mini_batches=1,
            num_ppo_epochs=1,
            total_episodes=len(batch) * steps,
            response_length=response_len,
            temperature=temperature,
            kl_coef=0.01,
            num_sample_generations=0,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            bf16=torch.cuda.is_available(),
            seed=0,
        )
        trainer = PPOTrainer(
            args=args,
            processing_class=ids,
            model=policy,
            ref_model=ref,
            reward_model=reward,
            value_model=value,
            train_dataset=Dataset.from_dict({"input_ids": [t[:PROMPT] for t in tokens]}),
            data_collator=lambda r: {"input_ids": torch.tensor([x["input_ids"] for x in r])},
            callbacks=[timer],
        )
        trainer.train()
    return {
        "times": timer.times,
        "trl": trl.__version__,
        "micro_batch_episodes": rows,
        "padded_tokens": len(batch) * max_len,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="0.5b")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--budget", type=int, default=32_768, help="micro-batch padded tokens (both)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--runs", default="ours,trl")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    vocab = qwen2_config(args.model, 16).vocab_size
    batch = trajectories(args.episodes, args.min_len, args.max_len, vocab)
    tokens = sum(len(t.token_ids) for t in batch)
    fns: dict[str, Callable[[int], dict[str, Any]]] = {
        "ours": lambda b: ours(args.model, batch, b, args.steps, "auto", "auto"),
        "trl": lambda b: trl_step(args.model, batch, b, args.steps),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for label in args.runs.split(","):
        budget = args.budget
        while True:
            reset_memory()
            try:
                result = fns[label](budget)
                times = result.pop("times")
                rows.append(
                    {
                        "run": label,
                        "budget": budget,
                        "step_s": [round(x, 2) for x in times],
                        "tokens_per_s": round(tokens / min(times)),
                        "peak_gib": round(peak_gib(), 1),
                        **result,
                    }
                )
                break
            except Exception as exc:
                if not is_oom(exc) or budget <= 8192:
                    raise
                rows.append({"run": label, "budget": budget, "status": "out of memory"})
                budget //= 2
        print(json.dumps(rows[-1]), flush=True)
        (args.out / "ppo_vs_trl.json").write_text(json.dumps(rows, indent=1))
    done = {r["run"]: r for r in rows if "tokens_per_s" in r}
    summary = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": args.model,
        "episodes": args.episodes,
        "tokens_per_step": tokens,
        "ours_vs_trl": round(done["ours"]["tokens_per_s"] / done["trl"]["tokens_per_s"], 3)
        if {"ours", "trl"} <= done.keys()
        else None,
    }
    rows.append(summary)
    (args.out / "ppo_vs_trl.json").write_text(json.dumps(rows, indent=1))
    print("\n| run | micro-batch tokens | step s | tokens/s | peak GiB |\n|---|---|---|---|---|")
    for r in rows[:-1]:
        print(
            f"| {r['run']} | {r['budget']} | {r.get('step_s', 'OOM')} | {r.get('tokens_per_s', '')} "
            f"| {r.get('peak_gib', '')} |"
        )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
