"""Activation checkpointing of decoder layers: which layers recompute in the backward pass, and what each
keeps (`spec.trainer.activationCheckpointing`, `checkpointedLayers`, `saveAttentionOutputs`).

Recomputing every layer costs one more forward per training pass; with memory to spare it buys nothing.
`checkpointedLayers` absent ("auto") checkpoints, before each training micro-batch, the fewest layers whose
saved activations fit the device's free memory. The estimate is a formula of the model's shape, checked
against the tensors autograd actually saves (tests/trainer/test_checkpointing.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from cuda_agent.api.trainingrun import TrainerSpec

# Share of the device kept free of planned activations: allocator fragmentation, the rotary tables, the
# embedding and final-norm outputs, kernel workspaces.
RESERVE_FRACTION = 0.1
# Bytes per (token x vocabulary entry) alive while one chunk of log-probs is computed or recomputed:
# bf16 logits, their fp32 copy, fp32 log-softmax, and the entropy's or the backward's two fp32 temporaries.
LOGITS_BYTES = 18


def _attention_ops() -> frozenset[Any]:
    names = (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    return frozenset(getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n))


def _keep_attention(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _attention_ops() else CheckpointPolicy.PREFER_RECOMPUTE


@dataclass(frozen=True)
class LayerFootprint:
    """Activation bytes one decoder layer holds per token between its forward and its backward."""

    full: int  # not checkpointed: every tensor autograd saves
    kept: int  # checkpointed: its input (and, selective, the attention kernel's output and log-sum-exp)


def layer_footprint(
    config: PretrainedConfig, dtype_bytes: int, save_attention: bool, expanded_kv: bool = False
) -> LayerFootprint:
    """Per-token activation bytes of a Llama/Qwen2-style layer (RMSNorm, rotary GQA attention, SwiGLU).

    Each RMSNorm saves an fp32 copy of its input, 1/rms, its normalised input and its output; attention
    saves the rotated query, key, value, output and fp32 log-sum-exp per head; the MLP saves gate, up,
    SiLU(gate) and their product. expanded_kv: key/value repeated to every query head before the kernel.
    """
    text = config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv = heads if expanded_kv else int(getattr(text, "num_key_value_heads", None) or heads)
    b = dtype_bytes
    norm = 4 * hidden + 4 + 2 * b * hidden
    attention = b * heads * head_dim * 2 + 2 * b * kv * head_dim + 4 * heads
    mlp = 4 * b * int(text.intermediate_size)
    kept = b * hidden + (b * heads * head_dim + 4 * heads if save_attention else 0)
    return LayerFootprint(full=2 * norm + attention + mlp, kept=kept)


def checkpointed_layer_count(layers: int, tokens: int, footprint: LayerFootprint, budget_bytes: int) -> int:
    """The fewest of `layers` decoder layers to checkpoint so that a micro-batch of `tokens` keeps at most
    `budget_bytes` of activations (all of them when even that does not fit)."""
    full, kept = tokens * footprint.full, tokens * footprint.kept
    excess = layers * full - budget_bytes
    if excess <= 0:
        return 0
    if full <= kept:
        return layers
    return min(layers, math.ceil(excess / (full - kept)))


def activation_budget(free_bytes: int, total_bytes: int, pending_bytes: int, transient_bytes: int) -> int:
    """Bytes a micro-batch's layer activations may take: what is free now, less what this step will still
    allocate (gradients, optimizer states), the peak of the log-prob chunk, and a reserve."""
    return max(0, free_bytes - pending_bytes - transient_bytes - int(RESERVE_FRACTION * total_bytes))


def decoder_layers(model: nn.Module) -> list[GradientCheckpointingLayer]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def _config_of(model: nn.Module) -> PretrainedConfig:
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            return module.config
    raise TypeError(f"{type(model).__name__} holds no Hugging Face model")


def enable_checkpointing(model: PreTrainedModel, spec: TrainerSpec) -> None:
    """Make every decoder layer able to recompute in the backward pass (with saveAttentionOutputs, all of it
    but the attention kernel, whose output is kept: at 131k tokens attention is most of a layer's time and
    its output only tokens x hidden); then checkpoint the first `checkpointedLayers` when that is set."""
    if not spec.activation_checkpointing:
        return
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if spec.save_attention_outputs:
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _keep_attention)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[no-untyped-call]
    if spec.checkpointed_layers is not None:
        set_checkpointed_layers(model, spec.checkpointed_layers)


def set_checkpointed_layers(model: nn.Module, count: int) -> None:
    """Checkpoint the first `count` decoder layers, keep the others' activations."""
    for index, layer in enumerate(decoder_layers(model)):
        layer.gradient_checkpointing = index < count


class LayerPlan:
    """A role's choice of checkpointed layers before each training forward (`checkpointedLayers` absent
    on a GPU); otherwise fixed when the model was built. logits_tokens: the log-prob chunk size of a policy,
    0 for a critic."""

    def __init__(self, model: nn.Module, spec: TrainerSpec, logits_tokens: int) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        config = _config_of(model)
        self.automatic = (
            spec.activation_checkpointing and spec.checkpointed_layers is None and bool(self.layers)
        )
        dtype_bytes = torch.finfo(next(model.parameters()).dtype).bits // 8
        self.footprint = layer_footprint(
            config, dtype_bytes, spec.save_attention_outputs, spec.attention_backend == "cudnn"
        )
        vocab = int(config.get_text_config().vocab_size)
        self.logits_bytes_per_token = vocab * LOGITS_BYTES
        self.logits_tokens = logits_tokens
        self.count = sum(1 for layer in self.layers if layer.gradient_checkpointing)

    def before_forward(self, tokens: int, pending_bytes: int) -> int:
        """Set the checkpointed layers for a training micro-batch of `tokens` (this rank's); returns the
        count. On CPU the automatic plan checkpoints every layer (host memory is not budgeted)."""
        if not self.automatic:
            return self.count
        device = next(self.model.parameters()).device
        if device.type != "cuda":
            return self.count
        free, total = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        transient = min(self.logits_tokens, tokens) * self.logits_bytes_per_token
        budget = activation_budget(free, total, pending_bytes, transient)
        count = checkpointed_layer_count(len(self.layers), tokens, self.footprint, budget)
        if count != self.count:
            set_checkpointed_layers(self.model, count)
            self.count = count
        return count
