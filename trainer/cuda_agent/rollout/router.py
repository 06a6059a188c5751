"""Several engines behind one `GenerationBackend`: an episode's first turn goes to the least-loaded
engine, and every later turn to the same one (its prefix cache holds the episode's context). The
trainer's weight-update hook fans out to every engine. `EngineActorBackend` makes an engine running as a
Ray actor (vllm_engine.VLLMEngine, hf.TransformersEngine) one of them: the Ray plumbing lives here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cuda_agent.rollout.base import FinishReason, Generation, GenerationBackend, SamplingParams

NamedTensors = list[tuple[str, Any]]  # [(parameter name, tensor)], one bucket of a weight update


class UpdatableBackend(GenerationBackend, Protocol):
    async def update_weights(self, bucket: NamedTensors) -> None: ...


@runtime_checkable
class StagedWeightUpdates(Protocol):
    async def finish_weight_update(self) -> None: ...


class RoutedBackend:
    def __init__(self, engines: Sequence[GenerationBackend]) -> None:
        if not engines:
            raise ValueError("no engines to route to")
        self.engines = list(engines)
        self.token_exact = all(e.token_exact for e in self.engines)
        self.in_flight = [0] * len(self.engines)
        self.sessions = [0] * len(self.engines)  # episodes pinned to each engine
        self._sticky: dict[str, int] = {}

    def engine_for(self, session: str | None) -> int:
        """The session's engine, or the least-loaded one (fewest pinned episodes, then fewest requests)."""
        if session is not None and session in self._sticky:
            return self._sticky[session]
        index = min(range(len(self.engines)), key=lambda i: (self.sessions[i], self.in_flight[i], i))
        if session is not None:
            self._sticky[session] = index
            self.sessions[index] += 1
        return index

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        index = self.engine_for(session)
        self.in_flight[index] += 1
        try:
            return await self.engines[index].generate(prompt_ids, sampling, session=session)
        finally:
            self.in_flight[index] -= 1

    async def release(self, session: str) -> None:
        index = self._sticky.pop(session, None)
        if index is not None:
            self.sessions[index] -= 1
            await self.engines[index].release(session)

    async def update_weights(self, bucket: NamedTensors) -> None:
        """Load one bucket into every engine at once; the trainer sends an update bucket by bucket
        (bounded memory on the sender) and then calls `finish_weight_update`. Call it between rollout
        batches: requests in flight would mix weights."""
        await asyncio.gather(*(_updatable(e).update_weights(bucket) for e in self.engines))

    async def finish_weight_update(self) -> None:
        # An engine that stages an update (vLLM reloads layer by layer) applies it once all buckets are in.
        staged = [e for e in self.engines if isinstance(e, StagedWeightUpdates)]
        await asyncio.gather(*(e.finish_weight_update() for e in staged))


def _updatable(engine: GenerationBackend) -> UpdatableBackend:
    if not hasattr(engine, "update_weights"):
        raise TypeError(f"{type(engine).__name__} has no update_weights hook")
    return engine  # type: ignore[return-value]


class EngineActorBackend:
    """A `GenerationBackend` over one engine Ray actor handle: a VLLMEngine, or a TransformersEngine
    (cuda_agent.rollout.hf) where vLLM is not available. The session goes along, so an engine that keeps
    per-episode state (the transformers KV cache) can use it."""

    token_exact = True

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        token_ids, logprobs, finish = await self.actor.generate.remote(prompt_ids, sampling, session)
        reason: FinishReason = finish if finish in ("stop", "length") else "abort"
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=reason)

    async def release(self, session: str) -> None:
        await self.actor.release.remote(session)

    async def update_weights(self, bucket: list[tuple[str, Any]]) -> None:
        await self.actor.update_weights.remote(bucket)

    async def finish_weight_update(self) -> None:
        # A VLLMEngine stages the buckets of one update; a TransformersEngine applies each on arrival.
        if hasattr(self.actor, "finish_weight_update"):  # a Ray handle raises for unknown methods
            await self.actor.finish_weight_update.remote()
