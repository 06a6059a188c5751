"""The OpenAI-compatible HTTP backend against a completions endpoint on 127.0.0.1.

No OpenAI-compatible server can run here (vLLM's wheel needs a CUDA torch), so the endpoint is a
stand-in written for this test: an aiohttp route speaking the completions protocol as vLLM's server does
(token-id prompts, `return_tokens_as_token_ids`, `logprobs`, `stop_token_ids`), backed by the real
transformers backend. The backend under test is the production class."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from rollout_helpers import build_tiny_model

from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend
from cuda_agent.rollout.openai_http import EndpointError, OpenAICompatibleBackend


def completions_app(
    engine: TransformersBackend, tokenizer: Any, calls: list[dict[str, Any]]
) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(body)
        if body.get("model") != "policy":
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else tokenizer(prompt, add_special_tokens=False)["input_ids"]
        sampling = SamplingParams(
            temperature=body["temperature"],
            top_p=body["top_p"],
            max_tokens=body["max_tokens"],
            seed=body.get("seed"),
            stop_token_ids=tuple(body.get("stop_token_ids", ())),
        )
        gen = await engine.generate(ids, sampling)
        if body.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{t}" for t in gen.token_ids]
        else:
            tokens = [tokenizer.decode([t]) for t in gen.token_ids]
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": gen.finish_reason,
            "logprobs": {"tokens": tokens, "token_logprobs": gen.logprobs},
        }
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def run_with_endpoint(tokenizer: Any, engine: TransformersBackend, scenario: Any) -> Any:
    async def main() -> Any:
        calls: list[dict[str, Any]] = []
        runner = web.AppRunner(completions_app(engine, tokenizer, calls))
        await runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            return await scenario(f"http://127.0.0.1:{port}", calls)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_token_mode_is_exact(smollm2_tokenizer: Any) -> None:
    model = build_tiny_model(vocab_size=len(smollm2_tokenizer))
    engine = TransformersBackend(model, [smollm2_tokenizer.eos_token_id])
    prompt = smollm2_tokenizer("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    sampling = SamplingParams(temperature=0.9, max_tokens=10, seed=11, stop_token_ids=(2,))
    direct = asyncio.run(engine.generate(prompt, sampling))

    async def scenario(url: str, calls: list[dict[str, Any]]) -> Any:
        backend = OpenAICompatibleBackend(url, "policy", mode="tokens")
        try:
            return await backend.generate(prompt, sampling)
        finally:
            await backend.close()

    calls: list[dict[str, Any]] = []

    async def recorded(url: str, seen: list[dict[str, Any]]) -> Any:
        result = await scenario(url, seen)
        calls.extend(seen)
        return result

    over_http = run_with_endpoint(smollm2_tokenizer, engine, recorded)
    assert over_http.token_ids == direct.token_ids and over_http.logprobs == direct.logprobs
    assert over_http.finish_reason == direct.finish_reason
    (body,) = calls
    assert body["prompt"] == prompt and body["return_tokens_as_token_ids"] and body["logprobs"] == 1
    assert body["stop_token_ids"] == [2] and body["seed"] == 11


def test_text_mode_is_marked_not_token_exact_and_errors_name_the_status(smollm2_tokenizer: Any) -> None:
    model = build_tiny_model(vocab_size=len(smollm2_tokenizer))
    engine = TransformersBackend(model, [smollm2_tokenizer.eos_token_id])
    prompt = smollm2_tokenizer("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]

    async def scenario(url: str, calls: list[dict[str, Any]]) -> Any:
        text_backend = OpenAICompatibleBackend(url, "policy", mode="text", tokenizer=smollm2_tokenizer)
        wrong_model = OpenAICompatibleBackend(url, "other", mode="tokens")
        try:
            generation = await text_backend.generate(prompt, SamplingParams(max_tokens=8, seed=1))
            with pytest.raises(EndpointError, match="404: model not found"):
                await wrong_model.generate(prompt, SamplingParams(max_tokens=8))
            return text_backend, generation, calls
        finally:
            await text_backend.close()
            await wrong_model.close()

    backend, generation, calls = run_with_endpoint(smollm2_tokenizer, engine, scenario)
    assert not backend.token_exact and isinstance(calls[0]["prompt"], str)
    assert calls[0]["prompt"].startswith("<|im_start|>user\nhi")
    assert generation.text is not None
    assert generation.token_ids == smollm2_tokenizer(generation.text, add_special_tokens=False)["input_ids"]
    assert len(generation.logprobs) == len(generation.token_ids)
