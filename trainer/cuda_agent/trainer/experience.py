"""Trajectories as tensors: shifted action masks, micro-batches packed by a token budget.

Position j of an episode's tensors scores token j + 1 (the model predicts the next token), so an
episode of n tokens has n - 1 action positions; `mask[j] = loss_mask[j + 1]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from cuda_agent.agent.trajectory import Trajectory


@dataclass
class Episode:
    """One trajectory's tensors (1-D, unpadded) and what later phases attach to it."""

    episode_id: str
    input_ids: torch.Tensor  # [n] int64
    mask: torch.Tensor  # [n - 1] fp32, 1 on policy tokens
    rollout_logprobs: torch.Tensor  # [n - 1] fp32, the engine's log-probs (0 off-mask)
    reward: float
    passed: bool
    faster_than_compile: bool
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    extras: dict[str, float] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.input_ids.numel())


def episode_from_trajectory(trajectory: Trajectory) -> Episode:
    ids = torch.tensor(trajectory.token_ids, dtype=torch.long)
    verdict = trajectory.verdict
    return Episode(
        episode_id=trajectory.episode_id,
        input_ids=ids,
        mask=torch.tensor(trajectory.loss_mask[1:], dtype=torch.float32),
        rollout_logprobs=torch.tensor(trajectory.logprobs[1:], dtype=torch.float32),
        reward=float(trajectory.reward),
        passed=bool(verdict.correct) if verdict else trajectory.reward >= 1,
        faster_than_compile=trajectory.reward >= 3,
    )


@dataclass
class MicroBatch:
    """Right-padded episodes: input_ids [b, L]; per-position tensors are [b, L - 1]."""

    indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None  # None when no episode is padded
    mask: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group episode indices so each group's padded size (count x longest) stays within token_budget.

    Episodes are taken longest first, so similar lengths share a group and padding stays small; an episode
    longer than the budget gets a group of its own. Deterministic for equal inputs.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1) * longest > token_budget:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def pad_stack(rows: Sequence[torch.Tensor], length: int, value: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


def collate(episodes: Sequence[Episode], indices: list[int], device: torch.device) -> MicroBatch:
    chosen = [episodes[i] for i in indices]
    longest = max(e.length for e in chosen)
    ids = pad_stack([e.input_ids for e in chosen], longest).to(device)
    padded = any(e.length < longest for e in chosen)
    attention = None
    if padded:
        attention = pad_stack([torch.ones(e.length, dtype=torch.long) for e in chosen], longest).to(device)
    mask = pad_stack([e.mask for e in chosen], longest - 1).to(device)
    return MicroBatch(indices, ids, attention, mask)


def gather(episodes: Sequence[Episode], batch: MicroBatch, name: str) -> torch.Tensor:
    """Stack one per-position attribute (old_logprobs, advantages, ...) of the batch's episodes."""
    if not batch.indices:  # an idle micro-batch (see roles.ShardPlan)
        return torch.zeros_like(batch.mask)
    rows = [getattr(episodes[i], name) for i in batch.indices]
    return pad_stack(rows, batch.input_ids.shape[1] - 1).to(batch.input_ids.device)


def scatter(episodes: Sequence[Episode], batch: MicroBatch, name: str, values: torch.Tensor) -> None:
    """Store each row of a [b, L - 1] result on its episode, unpadded, on the CPU."""
    for row, index in enumerate(batch.indices):
        n = episodes[index].length - 1
        setattr(episodes[index], name, values[row, :n].detach().float().cpu())
