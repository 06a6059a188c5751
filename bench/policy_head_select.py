"""The LM head at policy positions only (Policy.forward's `select`) against the head at every position, on an
agent episode: forward + backward of the masked NLL, the same model and tokens, interleaved in one run.

    .venv/bin/python bench/policy_head_select.py                 # the demo's tiny policy, its demonstrations
    .venv/bin/python bench/policy_head_select.py --repeats 10

An episode of the agent loop is mostly prompt and tool output (the shipped demonstrations: ~2.2k prompt
tokens, ~650 reply tokens), and only reply tokens carry loss; with a 49,152-word vocabulary the head is most
of the work of a small policy. Prints seconds per step of both and their ratio; the losses must agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.trainingrun import ModelSource, TrainerSpec
from cuda_agent.trainer.experience import episode_from_trajectory
from cuda_agent.trainer.models import build_policy

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--demonstrations", type=Path, default=REPO / "examples/trajectories/local-demo.jsonl"
    )
    args = parser.parse_args()
    lines = [line for line in args.demonstrations.read_text().splitlines() if line.strip()]
    episode = episode_from_trajectory(Trajectory.from_json(lines[-1]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    source = ModelSource(base=str(REPO / "examples/models/tiny-smollm2"), random_init=True)
    trainer = TrainerSpec(precision="fp32", logits_chunk_tokens=512)
    policy = build_policy(source, trainer).to(device)
    ids, mask = episode.input_ids[None].to(device), episode.mask[None].to(device)

    def step(select: torch.Tensor | None) -> tuple[float, float]:
        policy.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        logp, _ = policy(ids, None, None, None, select)
        loss = -(logp * mask).sum() / mask.sum()
        loss.backward()  # type: ignore[no-untyped-call]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, float(loss.detach())

    step(None), step(mask > 0)  # warm-up
    full, selected = [], []
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        seconds, loss_full = step(None)
        full.append(seconds)
        seconds, loss_selected = step(mask > 0)
        selected.append(seconds)
        assert abs(loss_full - loss_selected) < 1e-4 * max(1.0, abs(loss_full)), (loss_full, loss_selected)
    a, b = statistics.median(full), statistics.median(selected)
    print(f"episode: {ids.shape[1]} tokens, {int(mask.sum())} policy tokens, device {device}")
    print("| head at | s / step (median) |")
    print("|---|---|")
    print(f"| every position | {a:.3f} |")
    print(f"| policy positions | {b:.3f} |")
    print(f"ratio (every / policy): {a / b:.2f}x")


if __name__ == "__main__":
    main()
