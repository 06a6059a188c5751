"""The transformers backend's batched sampler and its prefill counter (what the GPU check,
tests/gpu/rollout_hf_gpu.py, relies on), and TransformersEngine's device placement. CPU, tiny model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend, TransformersEngine, sample_tokens

EOS = 511


def test_batched_sampling_equals_each_row_alone_and_multinomial() -> None:
    """Rows sampled together draw what each would alone from its own seeded generator, what
    torch.multinomial draws from that seed, and report log_softmax(logits / T) at the token."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 3
    samplings = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=1.0, top_k=40, top_p=0.9),
    ]

    def generators() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(10 + i) for i in range(len(samplings))]

    tokens, logprobs = sample_tokens(logits, samplings, generators())
    for i, sampling in enumerate(samplings):
        alone_tokens, alone_logprobs = sample_tokens(logits[i : i + 1], [sampling], [generators()[i]])
        assert alone_tokens == [tokens[i]] and abs(alone_logprobs[0] - logprobs[i]) < 1e-6
        logp = torch.log_softmax(logits[i] / (sampling.temperature or 1.0), dim=-1)
        assert abs(logprobs[i] - float(logp[tokens[i]])) < 1e-6
    assert tokens[1] == int(logits[1].argmax())
    plain = torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generators()[0])
    assert tokens[0] == int(plain)
    assert int((logits[3] > logits[3, tokens[3]]).sum()) < 5  # within the top 5

    # Truncation only restricts where samples land: many draws stay inside top-k and the top-p nucleus.
    k_sampling, p_sampling = SamplingParams(top_k=3), SamplingParams(top_p=0.5)
    row = logits[0:1].repeat(200, 1)
    gens = [torch.Generator().manual_seed(s) for s in range(200)]
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    assert set(sample_tokens(row, [k_sampling] * 200, gens)[0]) <= top3
    probs, order = torch.sort(torch.softmax(logits[0], -1), descending=True)
    nucleus = set(order[: int((torch.cumsum(probs, 0) < 0.5).sum()) + 1].tolist())
    assert set(sample_tokens(row, [p_sampling] * 200, gens)[0]) <= nucleus


def test_prefill_counts_only_tokens_the_session_cache_does_not_hold(tiny_model: Any) -> None:
    backend = TransformersBackend(tiny_model, [EOS])
    greedy = SamplingParams(temperature=0.0, max_tokens=5)

    async def main() -> tuple[list[int], int]:
        counts = []

        async def turn(ids: list[int], session: str | None) -> list[int]:
            before = backend.prefill_tokens
            gen = await backend.generate(ids, greedy, session=session)
            counts.append(backend.prefill_tokens - before)
            return gen.token_ids

        prompt = list(range(10, 60))
        out = await turn(prompt, "s")
        extended = prompt + out + [7, 8, 9]
        await turn(extended, "s")  # the cache holds prompt + out[:-1]: out[-1] and 3 more are new
        await turn([1, *extended[1:]], "s")  # not an extension: the whole prompt again
        await turn(extended, None)  # no session, no cache
        await backend.update_weights(list(tiny_model.state_dict().items())[:1])
        await turn(extended, "s")  # weights changed: cached keys are stale, dropped
        return counts, len(extended)

    counts, n = asyncio.run(main())
    assert counts == [50, 4, n, n, n]
    backend.close()


def test_engine_serves_a_saved_model_on_the_device_it_is_given(tiny_model: Any, tmp_path: Path) -> None:
    tiny_model.save_pretrained(tmp_path)
    engine = TransformersEngine(str(tmp_path), [EOS], device="cpu", max_batch=4)
    assert next(engine.backend.model.parameters()).device.type == "cpu"
    assert engine.backend.max_batch == 4
    prompt, greedy = list(range(5, 30)), SamplingParams(temperature=0.0, max_tokens=6)
    ids, logprobs, _ = asyncio.run(engine.generate(prompt, greedy))
    want = asyncio.run(TransformersBackend(tiny_model, [EOS]).generate(prompt, greedy))
    assert ids == want.token_ids
    assert max(abs(a - b) for a, b in zip(logprobs, want.logprobs, strict=True)) < 1e-5
    engine.backend.close()
