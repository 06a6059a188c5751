"""Activation checkpointing policy (`spec.trainer.checkpointedLayers`): how many layers the automatic plan
checkpoints for a memory budget, the per-token activation estimate against what autograd really saves,
and one PPO step with none, one or all layers checkpointed giving the same losses and gradients."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_ppo_step import make_trajectories
from transformers import Qwen2Config, Qwen2Model

from cuda_agent.api.trainingrun import TrainingRun, TrainingRunSpec
from cuda_agent.trainer.checkpointing import (
    RESERVE_FRACTION,
    LayerFootprint,
    activation_budget,
    checkpointed_layer_count,
    decoder_layers,
    enable_checkpointing,
    layer_footprint,
)
from cuda_agent.trainer.models import build_critic, build_policy, build_reference
from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic
from cuda_agent.trainer.step import ppo_step

GIB = 2**30


def test_layer_count_is_the_fewest_that_fit() -> None:
    fp = LayerFootprint(full=1000, kept=100)
    tokens, layers = 1024, 24
    assert checkpointed_layer_count(layers, tokens, fp, layers * tokens * 1000) == 0  # everything fits
    assert checkpointed_layer_count(layers, tokens, fp, 0) == layers  # nothing fits: all
    # one checkpointed layer holds `kept` instead of `full` per token
    one = (layers - 1) * tokens * 1000 + tokens * 100
    assert checkpointed_layer_count(layers, tokens, fp, one) == 1
    assert checkpointed_layer_count(layers, tokens, fp, one - 1) == 2
    # 10 layers checkpointed fit exactly; one byte less needs 11
    exact = (layers - 10) * tokens * 1000 + 10 * tokens * 100
    assert checkpointed_layer_count(layers, tokens, fp, exact) == 10
    assert checkpointed_layer_count(layers, tokens, fp, exact - 1) == 11
    # a checkpointed layer that keeps as much as a plain one saves nothing: all, never more
    assert checkpointed_layer_count(layers, tokens, LayerFootprint(full=100, kept=100), 1) == layers


def test_budget_leaves_pending_state_the_logits_chunk_and_a_reserve() -> None:
    total = 140 * GIB
    reserve = int(RESERVE_FRACTION * total)
    assert activation_budget(100 * GIB, total, 4 * GIB, 20 * GIB) == 76 * GIB - reserve
    assert activation_budget(10 * GIB, total, 4 * GIB, 20 * GIB) == 0


def test_auto_choice_for_the_benchmark_shapes() -> None:
    """What the automatic plan picks on a 139 GiB GPU: the 0.5B policy at 32k tokens keeps every layer;
    the 1.5B one at 131k tokens still checkpoints most of them."""
    qwen05 = Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2
    )
    qwen15 = Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2
    )
    logits = 8192 * 151_936 * 18
    free = 125 * GIB
    small = layer_footprint(qwen05, 2, save_attention=True)
    assert checkpointed_layer_count(24, 32_768, small, activation_budget(free, 139 * GIB, 0, logits)) == 0
    large = layer_footprint(qwen15, 2, save_attention=True)
    count = checkpointed_layer_count(28, 131_072, large, activation_budget(free, 139 * GIB, 0, logits))
    assert 14 < count < 28


def _saved_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of the distinct storages autograd saves for the backward of one forward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, 100, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids)
    return sum(storages.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_footprint_matches_what_autograd_saves(dtype: torch.dtype) -> None:
    """Per token and layer: the difference of a 2- and a 1-layer model between two lengths cancels the
    weights, the embedding and the final norm."""
    full: dict[tuple[int, bool], int] = {}
    for layers in (1, 2):
        config = Qwen2Config(
            hidden_size=64,
            intermediate_size=176,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=layers,
            vocab_size=100,
            use_cache=False,
        )
        model = Qwen2Model(config)
        torch.nn.Module.to(model, dtype)  # transformers' own `to` is typed for other arguments
        model.config._attn_implementation = "sdpa"
        model.train()
        for checkpointed in (False, True):
            if checkpointed:
                model.gradient_checkpointing_enable({"use_reentrant": False})  # type: ignore[no-untyped-call]
            full[layers, checkpointed] = _saved_bytes(model, 256) - _saved_bytes(model, 128)
    estimate = layer_footprint(config, dtype.itemsize, save_attention=False)
    assert (full[2, False] - full[1, False]) / 128 == estimate.full
    assert (full[2, True] - full[1, True]) / 128 == estimate.kept


def _roles(spec: TrainingRunSpec, initial: dict[str, Any]) -> tuple[PolicyActor, ValueCritic, Reference]:
    policy, critic = copy.deepcopy(initial["policy"]), copy.deepcopy(initial["critic"])
    for model in (policy.lm, critic.backbone):
        # the same initial weights under this spec's checkpointing
        for layer in decoder_layers(model):
            layer.gradient_checkpointing = False
        enable_checkpointing(model, spec.trainer)
    cpu = torch.device("cpu")
    return (
        PolicyActor(spec, cpu, policy),
        ValueCritic(spec, cpu, critic),
        Reference(spec, cpu, initial["ref"]),
    )


def _step(
    spec: TrainingRunSpec, initial: dict[str, Any]
) -> tuple[dict[str, float], dict[str, torch.Tensor], list[int]]:
    """One PPO step; each parameter's gradient summed over the step's backwards (before the optimizer
    clears it), and how often each policy layer's attention ran (once more per training micro-batch when
    the layer recomputes)."""
    actor, critic, reference = _roles(spec, initial)
    grads: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            grads[name] = grads[name] + grad.detach() if name in grads else grad.detach().clone()

        return hook

    for role, module in (("actor", actor.module), ("critic", critic.engine.module)):
        for name, p in module.named_parameters():
            p.register_hook(keep(f"{role}.{name}"))  # type: ignore[no-untyped-call]
    calls = [0] * len(decoder_layers(actor.module))
    for i, layer in enumerate(decoder_layers(actor.module)):
        attention = layer.get_submodule("self_attn")
        attention.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    metrics = ppo_step(make_trajectories(6), actor, critic, reference, spec, step_seed=0)
    return metrics, grads, calls


@pytest.fixture(scope="module")
def initial_models(run_document: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    spec = TrainingRun.model_validate(run_document()).spec
    torch.manual_seed(1)
    return {
        "policy": build_policy(spec.model, spec.trainer),
        "critic": build_critic(spec.model, spec.trainer),
        "ref": build_reference(spec.model, spec.trainer),
    }


def test_fewer_checkpointed_layers_give_the_same_step(
    run_document: Callable[..., dict[str, Any]], initial_models: dict[str, Any]
) -> None:
    def spec_with(**trainer: Any) -> TrainingRunSpec:
        return TrainingRun.model_validate(run_document(trainer=trainer)).spec

    # absent = automatic, which on CPU checkpoints every layer
    want_metrics, want_grads, full_calls = _step(spec_with(), initial_models)
    assert len(want_grads) == sum(1 for _ in initial_models["policy"].parameters()) + sum(
        1 for _ in initial_models["critic"].parameters()
    )
    for trainer, recomputed in (
        ({"checkpointedLayers": 1}, [True, False]),
        ({"checkpointedLayers": 0}, [False, False]),
        ({"activationCheckpointing": False}, [False, False]),
        ({"checkpointedLayers": 1, "saveAttentionOutputs": False}, [True, False]),
    ):
        metrics, grads, calls = _step(spec_with(**trainer), initial_models)
        for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "entropy"):
            assert metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), (trainer, key)
        assert grads.keys() == want_grads.keys()
        for name, want in want_grads.items():
            torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-7, msg=name)
        assert [got == full for got, full in zip(calls, full_calls, strict=True)] == recomputed, trainer
