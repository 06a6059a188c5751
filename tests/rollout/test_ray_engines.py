"""Engines as Ray actors behind the router: what the trainer runs with vLLM engines, here with the
transformers engine actor (vLLM cannot be installed in this venv), on a local Ray cluster bound to
127.0.0.1: results equal the engine run in-process, episodes stick to one actor after the least-loaded
first turn, and weight buckets reach every actor."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.ray_start import init_ray
from rollout_helpers import build_tiny_model

from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend, TransformersEngine
from cuda_agent.rollout.router import EngineActorBackend, RoutedBackend

EOS = 511


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    started = not ray.is_initialized()
    if started:
        init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:  # leave a cluster another fixture started alone
        ray.shutdown()


def test_engine_actors_route_sticky_and_take_weight_buckets(ray_local: Any, tmp_path: Path) -> None:
    first, second = build_tiny_model(seed=1), build_tiny_model(seed=2)
    first.save_pretrained(tmp_path / "policy")
    Engine = ray_local.remote(num_cpus=0.5)(TransformersEngine)
    router = RoutedBackend(
        [EngineActorBackend(Engine.remote(str(tmp_path / "policy"), [EOS])) for _ in range(2)]
    )
    local = TransformersBackend(first, [EOS])
    prompt = list(range(30, 70))
    sampling = SamplingParams(temperature=0.9, max_tokens=12, seed=4)

    async def main() -> None:
        a = await router.generate(prompt, sampling, session="a")
        b = await router.generate(prompt, sampling, session="b")
        expected = await local.generate(prompt, sampling)
        assert a.token_ids == b.token_ids == expected.token_ids  # same weights, same seed, other process
        assert max(abs(x - y) for x, y in zip(a.logprobs, expected.logprobs, strict=True)) < 1e-5
        assert router.engine_for("a") == 0 and router.engine_for("b") == 1
        # The second turn of "a" extends its prompt on the actor that holds its cache.
        again = await router.generate(prompt + a.token_ids + [5, 6], sampling, session="a")
        assert router.engine_for("a") == 0 and len(again.token_ids) >= 1
        await router.release("a")
        await router.release("b")

        named = list(second.state_dict().items())
        for bucket in (named[:5], named[5:]):  # the trainer's sync: bucket by bucket, then finish
            await router.update_weights(bucket)
        await router.finish_weight_update()
        greedy = SamplingParams(temperature=0.0, max_tokens=10)
        want = (await TransformersBackend(second, [EOS]).generate(prompt, greedy)).token_ids
        got = [(await e.generate(prompt, greedy)).token_ids for e in router.engines]
        assert got == [want, want]

    asyncio.run(main())
