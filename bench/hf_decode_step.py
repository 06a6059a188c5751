"""Where one decode step of the transformers rollout backend spends its time, against a plain
transformers decode loop on the same model in the same run (Qwen2-0.5B shape, random init, bf16).

    python3 bench/hf_decode_step.py --out $OUT            # on a GPU
    python3 bench/hf_decode_step.py --tiny --steps 8      # CPU smoke

Rows: a plain loop (`model(input_ids, past_key_values)` and argmax, nothing else), the plain loop with
the 2-D attention mask and position ids the backend passes, and the backend itself at one request
(`TransformersBackend.generate`, greedy). The ratio is each row's ms per step over the plain loop's.
Last, the backend's steps under the profiler: the ops with the most self CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _trainer_common import CONFIGS
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def plain_loop(model: Any, prompt: list[int], steps: int, with_mask: bool) -> float:
    """ms per decode step of the simplest greedy loop over a DynamicCache."""
    device = next(model.parameters()).device
    cache = DynamicCache()
    ids = torch.tensor([prompt], device=device)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    length = len(prompt)
    mask = torch.ones(1, length, dtype=torch.long, device=device)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        token = int(torch.argmax(logits, dim=-1).item())
        ids = torch.tensor([[token]], device=device)
        extra: dict[str, Any] = {}
        if with_mask:
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype, device=device)], 1)
            extra = {"attention_mask": mask, "position_ids": torch.tensor([[length]], device=device)}
        logits = model(
            input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **extra
        ).logits[:, -1]
        length += 1
    sync(device)
    return (time.perf_counter() - start) * 1e3 / steps


def timed_generate(backend: TransformersBackend, prompt: list[int], tokens: int) -> tuple[float, int]:
    """(seconds, decode steps) of one greedy request of `tokens` tokens."""
    before = backend.decode_steps
    start = time.perf_counter()
    asyncio.run(backend.generate(prompt, SamplingParams(temperature=0.0, max_tokens=tokens)))
    return time.perf_counter() - start, backend.decode_steps - before


def backend_loop(backend: TransformersBackend, prompt: list[int], steps: int) -> float:
    """ms per decode step: a request of steps + 1 tokens less one of a single token (its prefill)."""
    timed_generate(backend, prompt, steps + 1)  # warm-up
    prefill_s, _ = timed_generate(backend, prompt, 1)
    total_s, decode_steps = timed_generate(backend, prompt, steps + 1)
    return (total_s - prefill_s) * 1e3 / max(1, decode_steps)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=458)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen2Config(**CONFIGS["tiny" if args.tiny else "0.5b"], use_cache=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    prompt = torch.randint(0, config.vocab_size, (args.prompt,)).tolist()
    rows: dict[str, float] = {}
    plain_loop(model, prompt, 4, False)  # warm-up
    rows["plain loop"] = plain_loop(model, prompt, args.steps, False)
    rows["plain loop + mask, positions"] = plain_loop(model, prompt, args.steps, True)
    backend = TransformersBackend(model, [config.vocab_size], max_batch=64)
    try:
        rows["backend, 1 request"] = backend_loop(backend, prompt, args.steps)
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            backend_loop(backend, prompt, 8)
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60
        )
    finally:
        backend.close()
    print(table)
    print(f"\n{torch.__version__} {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    print(f"{'decode step':<32} {'ms':>8} {'vs plain':>8}")
    for name, ms in rows.items():
        print(f"{name:<32} {ms:>8.2f} {ms / rows['plain loop']:>7.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "hf_decode_step.json").write_text(json.dumps(rows, indent=1))
        (args.out / "hf_decode_step_profile.txt").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
