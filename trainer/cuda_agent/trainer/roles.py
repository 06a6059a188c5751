"""The PPO roles as plain objects: the policy actor, the critic and the frozen reference.

Each owns its network (and, when trainable, a TrainEngine) on one device and works on lists of Episodes,
cutting them into micro-batches by the token budget. `ray/` wraps the same classes as Ray actors; tests
and benchmarks use them directly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.trainer import ppo
from cuda_agent.trainer.checkpointing import LayerPlan
from cuda_agent.trainer.engine import TrainEngine
from cuda_agent.trainer.experience import Episode, MicroBatch, collate, gather, pack_micro_batches, scatter
from cuda_agent.trainer.models import Policy, build_critic, build_policy, build_reference
from cuda_agent.trainer.sequence_parallel import sequence_layout
from cuda_agent.trainer.weight_sync import load_bucket

NamedTensors = list[tuple[str, torch.Tensor]]


def default_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def _micro_batches(
    episodes: Sequence[Episode], indices: Sequence[int], budget: int, device: torch.device
) -> Iterator[MicroBatch]:
    lengths = [episodes[i].length for i in indices]
    for group in pack_micro_batches(lengths, budget):
        yield collate(episodes, [indices[g] for g in group], device)


@dataclass(frozen=True)
class ShardPlan:
    """How one data-parallel rank takes part in each optimizer step: the mini-batch's policy-token count
    over all ranks (losses are token means over the whole mini-batch) and the micro-batch count every rank
    runs (ZeRO's collectives need the same count on every rank; a rank with fewer runs idle ones).
    world_size is the data-parallel size: the ranks of a sequence-parallel group share one shard."""

    tokens: list[float]
    micro_batches: list[int]
    world_size: int = 1


def local_plan(episodes: Sequence[Episode], mini_batches: list[list[int]], budget: int) -> ShardPlan:
    tokens = [float(sum(float(episodes[i].mask.sum()) for i in indices)) for indices in mini_batches]
    counts = [
        len(pack_micro_batches([episodes[i].length for i in indices], budget)) for indices in mini_batches
    ]
    return ShardPlan(tokens, counts)


def _idle_batch(device: torch.device) -> MicroBatch:
    """Two padding tokens with no policy token: a rank's zero-loss share of a collective step."""
    return MicroBatch(
        [], torch.zeros(1, 2, dtype=torch.long, device=device), None, torch.zeros(1, 1, device=device)
    )


def _optimizer_steps(
    engine: TrainEngine,
    episodes: Sequence[Episode],
    mini_batches: list[list[int]],
    budget: int,
    plan: ShardPlan | None,
    grad_norms: list[float],
) -> Iterator[tuple[MicroBatch, float]]:
    """Yield (micro-batch, loss scale) for every backward of every optimizer step; steps the optimizer
    after each mini-batch and appends its gradient norm. scale = world_size / mini-batch tokens makes the
    ranks' averaged gradients the token-mean over the whole mini-batch."""
    plan = plan or local_plan(episodes, mini_batches, budget)
    for m, indices in enumerate(mini_batches):
        batches = list(_micro_batches(episodes, indices, budget, engine_device(engine)))
        batches += [_idle_batch(engine_device(engine)) for _ in range(plan.micro_batches[m] - len(batches))]
        engine.start(len(batches))
        for batch in batches:
            yield batch, plan.world_size / max(plan.tokens[m], 1.0)
        grad_norms.append(engine.finish())


def engine_device(engine: TrainEngine) -> torch.device:
    return next(engine.module.parameters()).device


class PolicyActor:
    """The policy being trained: old log-probs for the experience, the PPO update, the RFT update."""

    def __init__(
        self, spec: TrainingRunSpec, device: torch.device | None = None, model: nn.Module | None = None
    ) -> None:
        self.spec, self.device = spec, device or default_device()
        t = spec.trainer
        self.layout = sequence_layout(spec)
        module = (model if model is not None else build_policy(spec.model, t)).to(self.device)
        self.layout.install(module)
        self.engine = TrainEngine(
            module,
            lr=spec.algorithm.actor_learning_rate,
            backend=t.engine,
            zero_stage=t.zero_stage,
            max_grad_norm=t.max_grad_norm,
            bf16=t.precision == "bf16",
            warmup_steps=t.lr_warmup_steps,
            sequence_parallel=spec.resources.sequence_parallel_size > 1,
        )
        self.layer_plan = LayerPlan(self.engine.module, t, t.logits_chunk_tokens)
        self.select_policy_positions = t.engine == "torch" or t.zero_stage < 3

    @property
    def module(self) -> nn.Module:
        return self.engine.module

    def _logprobs(self, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy of this rank's positions (a slice of each sequence under sequence
        parallelism)."""
        x = self.layout.inputs(batch)
        if torch.is_grad_enabled():
            self.layer_plan.before_forward(x.input_ids.numel(), self.engine.pending_bytes())
        # Only policy positions reach the LM head (every use of these log-probs is masked), except under
        # ZeRO-3: there each call of the partitioned head gathers it, a collective, and the number of head
        # chunks must not depend on how many policy tokens each rank holds.
        select = self.layout.local(batch.mask) > 0 if self.select_policy_positions else None
        logp, entropy = self.engine.forward(x.input_ids, x.attention_mask, x.position_ids, x.targets, select)
        return logp, entropy

    @torch.no_grad()
    def compute_logprobs(self, episodes: list[Episode]) -> list[Episode]:
        """Fill old_logprobs (fp32) and the per-episode mean entropy of policy tokens."""
        self.engine.train(False)
        t = self.spec.trainer
        for batch in _micro_batches(episodes, range(len(episodes)), t.micro_batch_tokens, self.device):
            width = batch.mask.shape[1]
            logp, entropy = (self.layout.full(x, width) for x in self._logprobs(batch))
            scatter(episodes, batch, "old_logprobs", logp)
            for row, index in enumerate(batch.indices):
                m = batch.mask[row]
                episodes[index].extras["entropy"] = float((entropy[row] * m).sum() / m.sum().clamp(min=1))
        return episodes

    def train_ppo(
        self, episodes: list[Episode], mini_batches: list[list[int]], plan: ShardPlan | None = None
    ) -> dict[str, float]:
        """One optimizer step per mini-batch with the clip-higher loss, token-mean over the mini-batch."""
        self.engine.train(True)
        t, a = self.spec.trainer, self.spec.algorithm
        totals = {"policy_loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
        norms: list[float] = []
        tokens = 0
        local = self.layout.local
        for batch, scale in _optimizer_steps(
            self.engine, episodes, mini_batches, t.micro_batch_tokens, plan, norms
        ):
            logp, _ = self._logprobs(batch)
            mask = local(batch.mask)
            result = ppo.policy_loss(
                logp,
                local(gather(episodes, batch, "old_logprobs")),
                local(gather(episodes, batch, "advantages")),
                mask,
                a.clip_low,
                a.clip_high,
            )
            self.engine.backward(result.loss_sum * scale)
            weight = float(mask.sum())
            totals["policy_loss"] += float(result.loss_sum.detach())
            totals["clip_fraction"] += float(result.clip_fraction) * weight
            totals["approx_kl"] += float(result.approx_kl) * weight
            tokens += int(weight)
        *sums, total_tokens = self.layout.sum([*totals.values(), float(tokens)])
        tokens = int(total_tokens)
        metrics = {key: value / max(tokens, 1) for key, value in zip(totals, sums, strict=True)}
        metrics["actor_grad_norm"] = sum(norms) / max(len(norms), 1)
        metrics["policy_tokens"] = float(tokens)
        return metrics

    def train_nll(
        self,
        episodes: list[Episode],
        mini_batches: list[list[int]],
        plan: ShardPlan | None = None,
        learning_rate: float | None = None,
    ) -> dict[str, float]:
        """Rejection fine-tuning: token-mean negative log-likelihood of the policy tokens, one optimizer
        step per mini-batch at `learning_rate` (the RFT stage's own; the PPO rate when None)."""
        self.engine.train(True)
        total, tokens = 0.0, 0
        norms: list[float] = []
        budget = self.spec.trainer.micro_batch_tokens
        with self.engine.learning_rate(learning_rate):
            for batch, scale in _optimizer_steps(self.engine, episodes, mini_batches, budget, plan, norms):
                logp, _ = self._logprobs(batch)
                mask = self.layout.local(batch.mask)
                loss_sum = -(logp * mask).sum()
                self.engine.backward(loss_sum * scale)
                total += float(loss_sum.detach())
                tokens += int(mask.sum())
        total, all_tokens = self.layout.sum([total, float(tokens)])
        return {
            "nll": total / max(all_tokens, 1.0),
            "policy_tokens": all_tokens,
            "actor_grad_norm": sum(norms) / max(len(norms), 1),
            "optimizer_steps": float(len(norms)),
        }

    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The policy's full weights in buckets of about bucket_bytes (gathered under ZeRO-3)."""
        bucket: NamedTensors = []
        size = 0
        policy = self.module
        assert isinstance(policy, Policy)
        for name, param in policy.hf_named_parameters():
            with self.engine.gathered([param]):
                tensor = param.detach().clone()
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket

    def save(self, directory: Path) -> None:
        self.engine.save(directory)

    def load(self, directory: Path) -> None:
        self.engine.load(directory)


class ValueCritic:
    """The critic: values for GAE, the clipped value update, value pretraining."""

    def __init__(
        self, spec: TrainingRunSpec, device: torch.device | None = None, model: nn.Module | None = None
    ) -> None:
        self.spec, self.device = spec, device or default_device()
        t = spec.trainer
        self.layout = sequence_layout(spec)
        module = (model if model is not None else build_critic(spec.model, t)).to(self.device)
        self.layout.install(module)
        self.engine = TrainEngine(
            module,
            lr=spec.algorithm.critic_learning_rate,
            backend=t.engine,
            zero_stage=t.zero_stage,
            max_grad_norm=t.max_grad_norm,
            bf16=t.precision == "bf16",
            warmup_steps=t.lr_warmup_steps,
            sequence_parallel=spec.resources.sequence_parallel_size > 1,
        )
        self.layer_plan = LayerPlan(self.engine.module, t, 0)

    def _values(self, batch: MicroBatch) -> torch.Tensor:
        """Values of this rank's action positions (aligned with layout.local)."""
        x = self.layout.inputs(batch)
        if torch.is_grad_enabled():
            self.layer_plan.before_forward(x.input_ids.numel(), self.engine.pending_bytes())
        values: torch.Tensor = self.engine.forward(x.input_ids, x.attention_mask, x.position_ids)
        return self.layout.action_values(values)

    @torch.no_grad()
    def compute_values(self, episodes: list[Episode]) -> list[Episode]:
        self.engine.train(False)
        t = self.spec.trainer
        for batch in _micro_batches(episodes, range(len(episodes)), t.micro_batch_tokens, self.device):
            values = self.layout.full(self._values(batch), batch.mask.shape[1])
            scatter(episodes, batch, "values", values * batch.mask)
        return episodes

    def train_values(
        self,
        episodes: list[Episode],
        mini_batches: list[list[int]],
        plan: ShardPlan | None = None,
        learning_rate: float | None = None,
        clip: bool = True,
    ) -> dict[str, float]:
        """One optimizer step per mini-batch of the (clipped) value loss. Value pretraining passes its
        own `learning_rate` and `clip=False`: it regresses onto fixed returns, with no rollout values
        to stay near."""
        self.engine.train(True)
        t = self.spec.trainer
        total, clipped, tokens = 0.0, 0.0, 0
        norms: list[float] = []
        local = self.layout.local
        value_clip = t.value_clip if clip else float("inf")
        with self.engine.learning_rate(learning_rate):
            for batch, scale in _optimizer_steps(
                self.engine, episodes, mini_batches, t.micro_batch_tokens, plan, norms
            ):
                mask = local(batch.mask)
                loss_sum, fraction = ppo.value_loss(
                    self._values(batch),
                    local(gather(episodes, batch, "values")),
                    local(gather(episodes, batch, "returns")),
                    mask,
                    value_clip,
                )
                self.engine.backward(loss_sum * scale)
                weight = float(mask.sum())
                total += float(loss_sum.detach())
                clipped += float(fraction) * weight
                tokens += int(weight)
        total, clipped, all_tokens = self.layout.sum([total, clipped, float(tokens)])
        return {
            "value_loss": total / max(all_tokens, 1.0),
            "value_clip_fraction": clipped / max(all_tokens, 1.0),
            "critic_grad_norm": sum(norms) / max(len(norms), 1),
            "policy_tokens": all_tokens,
        }

    def save(self, directory: Path) -> None:
        self.engine.save(directory)

    def load(self, directory: Path) -> None:
        self.engine.load(directory)


class Reference:
    """The frozen reference policy of the KL term: the base model until the RFT stage ends, then the
    actor as RFT left it (the driver loads it with `update_weights`; checkpoints keep it)."""

    def __init__(
        self, spec: TrainingRunSpec, device: torch.device | None = None, model: nn.Module | None = None
    ) -> None:
        self.spec, self.device = spec, device or default_device()
        self.layout = sequence_layout(spec)
        self.module = (model if model is not None else build_reference(spec.model, spec.trainer)).to(
            self.device
        )
        self.layout.install(self.module)
        self.module.requires_grad_(False)
        self.module.eval()

    @torch.no_grad()
    def compute_logprobs(self, episodes: list[Episode]) -> list[Episode]:
        t = self.spec.trainer
        for batch in _micro_batches(episodes, range(len(episodes)), t.micro_batch_tokens, self.device):
            x = self.layout.inputs(batch)
            select = self.layout.local(batch.mask) > 0
            logp, _ = self.module(x.input_ids, x.attention_mask, x.position_ids, x.targets, select)
            scatter(episodes, batch, "ref_logprobs", self.layout.full(logp, batch.mask.shape[1]))
        return episodes

    def update_weights(self, bucket: NamedTensors) -> None:
        """Load one bucket of the actor's weights (Hugging Face names, as the rollout gets them)."""
        assert isinstance(self.module, Policy)
        load_bucket(self.module.lm, bucket)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.module.state_dict(), directory / "reference.pt")

    def load(self, directory: Path) -> None:
        # A checkpoint written before the reference was saved (older runs) keeps the base weights.
        if (directory / "reference.pt").exists():
            state = torch.load(directory / "reference.pt", map_location="cpu", weights_only=True)
            self.module.load_state_dict(state)
