"""Ulysses sequence parallelism for the actor, critic and reference (`spec.resources.sequenceParallelSize`).

The ranks of one sequence-parallel group hold the same episodes. Each feeds the model one contiguous slice
of every sequence, with global position ids (rotary embeddings see true positions). In each attention
layer DeepSpeed's `UlyssesSPAttentionHF` trades the sequence split for a head split with an all-to-all
(every rank attends over the whole sequence with heads / size of the heads), then trades back; everything
else (MLPs, norms, LM head, the chunked fp32 log-probs, the value head) runs on the rank's slice only.

Losses are sums over the slice's policy tokens. The attention all-to-all is differentiable, so summing
the ranks' parameter gradients gives the gradient of the whole sequences' loss; DeepSpeed sums gradients
over all ranks and divides by the data-parallel size (ranks / size), which is what the roles' loss scale
(`ShardPlan.world_size` = data-parallel size) expects. ZeRO partitions over all ranks of the job.

`WholeSequence` is the same interface for one rank holding whole sequences, so the roles read alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.trainer.engine import init_distributed
from cuda_agent.trainer.experience import MicroBatch

FIELD = "spec.resources.sequenceParallelSize"
ULYSSES_PREFIX = "cuda_agent_ulysses_"


@dataclass(frozen=True)
class ModelInputs:
    """One micro-batch as this rank feeds it to a model: ids [b, S]; with sequence parallelism also the
    global positions and the next token after each position (the last slice's final targets are padding)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None = None
    targets: torch.Tensor | None = None


class SequenceLayout(Protocol):
    """How a role's micro-batches map onto this rank (whole sequences, or one slice of each)."""

    def install(self, model: nn.Module) -> None: ...
    def inputs(self, batch: MicroBatch) -> ModelInputs: ...
    def local(self, per_position: torch.Tensor) -> torch.Tensor: ...
    def full(self, local: torch.Tensor, width: int) -> torch.Tensor: ...
    def action_values(self, values: torch.Tensor) -> torch.Tensor: ...
    def sum(self, values: list[float]) -> list[float]: ...


class WholeSequence:
    """One rank, whole sequences: the identity layout."""

    def install(self, model: nn.Module) -> None:
        return None

    def inputs(self, batch: MicroBatch) -> ModelInputs:
        """No attention mask: padding is on the right, so under causal attention no real token attends to
        it; a mask would make transformers build a [b, 1, L, L] one and SDPA take a slower masked kernel."""
        return ModelInputs(batch.input_ids, None)

    def local(self, per_position: torch.Tensor) -> torch.Tensor:
        return per_position

    def full(self, local: torch.Tensor, width: int) -> torch.Tensor:
        return local

    def action_values(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, :-1]  # the value after the last token scores no action

    def sum(self, values: list[float]) -> list[float]:
        return values


def check_heads(config: PretrainedConfig, size: int) -> None:
    """Ulysses splits attention heads over the group: `size` must divide the query heads, and divide the
    key/value heads or be a multiple of them (then each rank gets a replicated key/value head)."""
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    if heads % size:
        raise ValueError(f"{FIELD} = {size} must divide the model's {heads} attention heads")
    if kv_heads % size and size % kv_heads:
        raise ValueError(
            f"{FIELD} = {size} must divide the model's {kv_heads} key/value heads or be a multiple of them"
        )


class SequenceParallel:
    """This rank's place in its sequence-parallel group, and the slicing of micro-batches for it."""

    def __init__(self, group: Any, size: int, rank: int, device: torch.device) -> None:
        self.group, self.size, self.rank, self.device = group, size, rank, device

    def install(self, model: nn.Module) -> None:
        """Route the attention of every Hugging Face model inside `model` through Ulysses."""
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                check_heads(module.config, self.size)
                core = str(module.config._attn_implementation)
                if not core.startswith(ULYSSES_PREFIX):
                    module.set_attn_implementation(_register(core))

    def _padded(self, length: int) -> int:
        return -(-length // self.size) * self.size

    def _slice(self, tensor: torch.Tensor) -> torch.Tensor:
        width = tensor.shape[1] // self.size
        # Contiguous: Ulysses all-gathers the position ids, and NCCL refuses strided tensors.
        return tensor[:, self.rank * width : (self.rank + 1) * width].contiguous()

    def inputs(self, batch: MicroBatch) -> ModelInputs:
        """This rank's slice of the ids padded to a multiple of the group size. No attention mask:
        padding is on the right, so under causal attention no real token sees it."""
        ids = batch.input_ids
        rows, length = ids.shape
        pad = self._padded(length) - length
        positions = torch.arange(length + pad, device=ids.device).expand(rows, -1)
        return ModelInputs(
            self._slice(F.pad(ids, (0, pad))),
            None,
            self._slice(positions),
            self._slice(F.pad(ids[:, 1:], (0, pad + 1))),
        )

    def local(self, per_position: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a [b, L - 1] per-position tensor, aligned with `inputs`' positions."""
        width = per_position.shape[1]
        return self._slice(F.pad(per_position, (0, self._padded(width + 1) - width)))

    def full(self, local: torch.Tensor, width: int) -> torch.Tensor:
        """The group's slices put back together: [b, width] (no gradient flows back through this)."""
        parts = [torch.empty_like(local) for _ in range(self.size)]
        torch.distributed.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)[:, :width]

    def action_values(self, values: torch.Tensor) -> torch.Tensor:
        return values  # already aligned with `local` positions; those past the end are masked

    def sum(self, values: list[float]) -> list[float]:
        """Scalars summed over the group (metrics: every rank reports the group's totals)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, group=self.group)
        return [float(v) for v in tensor.tolist()]


_active: SequenceParallel | None = None


def sequence_layout(spec: TrainingRunSpec) -> SequenceLayout:
    """The layout `spec.resources.sequenceParallelSize` selects; the groups are made once per process
    (the actor, critic and reference of a rank share them)."""
    global _active
    size = spec.resources.sequence_parallel_size
    if size == 1:
        return WholeSequence()
    if spec.trainer.engine != "deepspeed":
        raise ValueError(f"{FIELD} = {size} needs spec.trainer.engine: deepspeed")
    if _active is not None:
        if _active.size != size:
            raise ValueError(f"{FIELD} = {size}, but this process already runs groups of {_active.size}")
        return _active
    init_distributed()
    world = torch.distributed.get_world_size()
    if world % size:
        raise ValueError(
            f"{FIELD} = {size} must divide the trainer's {world} processes "
            "(spec.resources.trainerGpus, one Ray rank each with spec.trainer.useRay)"
        )
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(size)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    _active = SequenceParallel(
        parallel_state_sp.get_sequence_parallel_group(),
        size,
        parallel_state_sp.get_sequence_parallel_rank(),
        device,
    )
    return _active


@functools.cache
def _register(core: str) -> str:
    """A transformers attention implementation running `core` (sdpa, or the trainer's cuDNN variant)
    inside Ulysses; its mask function is the core's (no mask is made for unpadded causal batches)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = ULYSSES_PREFIX + core
    AttentionInterface.register(name, functools.partial(_ulysses_attention, core))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[core])
    return name


_ulysses_modules: dict[tuple[str, int, int, int, int], Any] = {}


def _ulysses_attention(
    core: str,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One attention call through DeepSpeed's Ulysses module; one module per (core, batch size, head
    shape), since it fixes the batch size at construction and micro-batches vary."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert _active is not None, "sequence parallelism is not set up in this process"
    batch, heads, _, head_dim = query.shape
    cache_key = (core, batch, heads, int(key.shape[1]), head_dim)
    ulysses = _ulysses_modules.get(cache_key)
    if ulysses is None:
        ulysses = UlyssesSPAttentionHF(
            attn=ALL_ATTENTION_FUNCTIONS[core],
            batch_size=batch,
            attn_head_count=heads,
            attn_head_size=head_dim,
            kv_head_count=int(key.shape[1]),
            num_hidden_layers=int(getattr(module.config, "num_hidden_layers", 1)),
            process_group=_active.group,
            seq_length_is_variable=True,
        )
        _ulysses_modules[cache_key] = ulysses
    # Causal over the gathered sequence; a mask built for this rank's slice would be wrong there.
    output, weights = ulysses(module, query, key, value, None, *args, **kwargs)
    return output, weights
