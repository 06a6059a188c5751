"""Hugging Face transformers backend: CPU or one GPU, for tests, local runs and small models.

Sampling runs token by token over a KV cache, and each episode's cache is kept between its turns: the
next turn's prompt extends the previous one (token-in-token-out), so only the new tokens (the observation)
are run through the model, never the whole context again. Log-probs are computed in fp32 from the
model's logits. All model work happens on one worker thread: concurrent episodes are served one
generation at a time in arrival order, and the event loop never blocks on the model.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.rollout.base import FinishReason, Generation, SamplingParams


@dataclass
class _CachedPrefix:
    token_ids: list[int]  # the tokens whose keys and values the cache holds
    cache: Any


def sample_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> tuple[int, float]:
    """One token from fp32 `logits` [vocab] and its log-prob under logits / temperature (before top-k /
    top-p truncation, which only restricts where the sample may land); greedy at temperature 0."""
    logits = logits.float()
    if sampling.temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    allowed = logp.clone()
    if sampling.top_k > 0 and sampling.top_k < allowed.numel():
        kth = torch.topk(allowed, sampling.top_k).values[-1]
        allowed[allowed < kth] = float("-inf")
    if sampling.top_p < 1.0:
        sorted_lp, order = torch.sort(allowed, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_lp, dim=-1), dim=-1)
        drop = cumulative - torch.softmax(sorted_lp, dim=-1) >= sampling.top_p  # keep the first over top_p
        allowed[order[drop]] = float("-inf")
    probs = torch.softmax(allowed, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logp[token])


class TransformersBackend:
    """A causal LM from transformers as a `GenerationBackend`."""

    token_exact = True

    def __init__(
        self,
        model: Any,
        eos_token_ids: Iterable[int],
        *,
        max_cached_sessions: int = 16,
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model.eval()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.eos_token_ids = frozenset(eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids is empty: generation could never stop on its own")
        self.max_cached_sessions = max_cached_sessions
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generate")
        self._caches: OrderedDict[str, _CachedPrefix] = OrderedDict()
        self._lock = threading.Lock()  # guards _caches between the worker and release()
        self.generated_tokens = 0

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._generate, list(prompt_ids), sampling, session)

    async def release(self, session: str) -> None:
        with self._lock:
            self._caches.pop(session, None)

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Copy named tensors into the model's parameters and buffers (the trainer's weight sync). Runs on
        the worker thread, so it never overlaps a generation; cached prefixes are dropped (stale keys)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load, bucket)

    @torch.no_grad()
    def _load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        state = self.model.state_dict(keep_vars=True)
        unknown = [name for name, _ in bucket if name not in state]
        if unknown:
            raise KeyError(f"the model has no parameters named {unknown[:5]}")
        for name, tensor in bucket:
            state[name].copy_(tensor.to(state[name].device, state[name].dtype))
        with self._lock:
            self._caches.clear()

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _prefix(self, session: str | None, prompt_ids: list[int]) -> tuple[Any, list[int]]:
        """The session's cache when the new prompt extends what it holds, and the tokens still to feed."""
        from transformers import DynamicCache

        with self._lock:
            cached = self._caches.pop(session, None) if session is not None else None
        if cached is not None:
            n = len(cached.token_ids)
            if n < len(prompt_ids) and prompt_ids[:n] == cached.token_ids:
                return cached.cache, prompt_ids[n:]
        return DynamicCache(), prompt_ids

    def _forward(self, ids: list[int], cache: Any) -> torch.Tensor:
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        # Only the last position's logits are needed: [tokens x vocab] logits dominate a long prefill.
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        last: torch.Tensor = out.logits[0, -1].float()
        return last

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], sampling: SamplingParams, session: str | None) -> Generation:
        if not prompt_ids:
            raise ValueError("empty prompt")
        generator = torch.Generator(device="cpu")
        generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        stop = self.eos_token_ids | set(sampling.stop_token_ids)
        cache, feed = self._prefix(session, prompt_ids)
        logits = self._forward(feed, cache).cpu()
        tokens: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason = "length"
        for step in range(sampling.max_tokens):
            token, logprob = sample_token(logits, sampling, generator)
            tokens.append(token)
            logprobs.append(logprob)
            if token in stop:
                finish = "stop"
                break
            if step + 1 < sampling.max_tokens:
                logits = self._forward([token], cache).cpu()
        self.generated_tokens += len(tokens)
        if session is not None:
            # The cache now holds the prompt and every sampled token but the last (never fed back).
            with self._lock:
                self._caches[session] = _CachedPrefix(prompt_ids + tokens[:-1], cache)
                while len(self._caches) > self.max_cached_sessions:
                    self._caches.popitem(last=False)
        return Generation(token_ids=tokens, logprobs=logprobs, finish_reason=finish)
