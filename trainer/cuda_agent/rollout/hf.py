"""Hugging Face transformers backend: CPU or one GPU, for tests, local runs and small models.

Sampling runs token by token over a KV cache, and each episode's cache is kept between its turns: the
next turn's prompt extends the previous one (token-in-token-out), so only the new tokens (the observation)
are run through the model, never the whole context again. Log-probs are computed in fp32 from the
model's logits. All model work happens on one worker thread, so the event loop never blocks; requests
that wait there together are decoded as one batch (each prefilled on its own cache, then the caches
left-padded into one), so concurrent episodes share every forward pass instead of queueing for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from cuda_agent.rollout.base import FinishReason, Generation, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _CachedPrefix:
    token_ids: list[int]  # the tokens whose keys and values the cache holds
    cache: Any


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    session: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    generator: torch.Generator  # the request's own random stream, on the model's device
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None


@torch.no_grad()
def sample_tokens(
    logits: torch.Tensor, samplings: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """One token per row of `logits` [rows x vocab] (any float dtype, on the model's device) and its
    log-prob under logits / temperature in fp32 (before top-k / top-p truncation, which only restricts
    where the sample may land); greedy at temperature 0 (log-prob of the plain softmax).

    Rows are sampled together where the logits are, with one copy of the results to the host (row by
    row on the CPU, a 151,936-token vocabulary cost 8.6 ms a row, 30 ms with top-p, on a 2-core VM).
    Each row draws from its own request's generator, so a seeded request samples the same batched or
    alone: the draw is the exponential race torch.multinomial uses for one sample (argmax of p / Exp(1)
    noise), which consumes that generator exactly as multinomial does."""
    logits = logits.float()
    temperature = torch.tensor([s.temperature or 1.0 for s in samplings], device=logits.device)
    logp = torch.log_softmax(logits / temperature[:, None], dim=-1)
    greedy = [s.temperature == 0.0 for s in samplings]
    tokens = torch.argmax(logits, dim=-1)
    if not all(greedy):
        allowed = [logp[i] if greedy[i] else _truncate(logp[i], s) for i, s in enumerate(samplings)]
        noise = [
            torch.ones_like(row) if greedy[i] else torch.empty_like(row).exponential_(generator=generators[i])
            for i, row in enumerate(allowed)
        ]
        drawn = torch.argmax(torch.softmax(torch.stack(allowed), dim=-1) / torch.stack(noise), dim=-1)
        tokens = torch.where(torch.tensor(greedy, device=logits.device), tokens, drawn)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    return [int(t) for t in tokens.tolist()], [float(x) for x in chosen.tolist()]


def _truncate(logp: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """`logp` [vocab] with what top-k / top-p exclude set to -inf (no host sync: masks, no indexing)."""
    allowed = logp
    if 0 < sampling.top_k < allowed.numel():
        kth = torch.topk(allowed, sampling.top_k).values[-1]
        allowed = allowed.masked_fill(allowed < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_lp, order = torch.sort(allowed, descending=True)
        probs = torch.softmax(sorted_lp, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs >= sampling.top_p  # keep the first token past top_p
        allowed = allowed.scatter(0, order, sorted_lp.masked_fill(drop, float("-inf")))
    return allowed


class TransformersBackend:
    """A causal LM from transformers as a `GenerationBackend`."""

    token_exact = True

    def __init__(
        self,
        model: Any,
        eos_token_ids: Iterable[int],
        *,
        max_batch: int = 32,
        max_cached_sessions: int = 64,
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model.eval()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.eos_token_ids = frozenset(eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids is empty: generation could never stop on its own")
        self.max_batch = max_batch
        self.max_cached_sessions = max_cached_sessions
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generate")
        self._caches: OrderedDict[str, _CachedPrefix] = OrderedDict()
        self._pending: list[_Request] = []
        self._lock = threading.Lock()  # guards _caches and _pending between the worker and the loop
        self.generated_tokens = 0
        self.decode_steps = 0  # batched forward passes of the decode loop (rows share them)
        # Prompt tokens run through the model: a turn that extends its session's cached prefix adds only
        # the new ones (how tests and the GPU check see that the cache was reused, not just correct).
        self.prefill_tokens = 0

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("empty prompt")
        loop = asyncio.get_running_loop()
        generator = torch.Generator(self.device)
        if sampling.seed is not None:
            generator.manual_seed(sampling.seed)
        else:  # its own entropy: torch.seed() would reseed the process's global generators too
            generator.seed()
        request = _Request(list(prompt_ids), sampling, session, loop, loop.create_future(), generator)
        with self._lock:
            self._pending.append(request)
        # Every request schedules one drain; a drain that finds the queue emptied by an earlier one
        # returns at once, so requests that arrived together run as one batch.
        loop.run_in_executor(self._executor, self._drain)
        return await request.future

    async def release(self, session: str) -> None:
        with self._lock:
            self._caches.pop(session, None)

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Copy named tensors into the model's parameters and buffers (the trainer's weight sync). Runs on
        the worker thread, so it never overlaps a generation; cached prefixes are dropped (stale keys)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load, bucket)

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ worker thread

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

    def _drain(self) -> None:
        """Continuous batching: admit waiting requests between decode steps, hand each result back the
        moment its row finishes, and return when nothing is active or waiting."""
        rows: list[_Row] = []
        taken: list[_Request] = []  # admitted, not yet rows
        try:
            batch = _Batch()
            while True:
                with self._lock:
                    room = self.max_batch - len(rows)
                    taken, self._pending = self._pending[:room], self._pending[room:]
                if taken:
                    new = [self._prefill(request) for request in taken]
                    batch.admit(new, self.device)
                    rows, taken = rows + new, []
                if not rows:
                    return
                self._sample(rows)
                finished = [r for r in rows if r.request.finish is not None]
                for row in finished:
                    self._finish(row, batch)
                rows = [r for r in rows if r.request.finish is None]
                if not rows:
                    batch = _Batch()
                    continue
                if finished:
                    batch.keep(rows)
                self._step(rows, batch)
        except Exception as exc:  # every caller whose request was in flight gets the error
            log.exception("generation batch failed", extra={"requests": len(rows) + len(taken)})
            for request in taken + [r.request for r in rows]:
                request.loop.call_soon_threadsafe(_fail, request.future, exc)

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

    def _forward(self, ids: torch.Tensor, cache: Any, **kwargs: Any) -> torch.Tensor:
        # Only the last position's logits are needed: [tokens x vocab] logits dominate a long prefill.
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **kwargs)
        last: torch.Tensor = out.logits[:, -1]  # stays on the device: sampling happens there
        return last

    @torch.no_grad()
    def _prefill(self, request: _Request) -> _Row:
        """Each request is prefilled alone, on its session's cached prefix (prompt lengths differ)."""
        cache, feed = self._prefix(request.session, request.prompt_ids)
        self.prefill_tokens += len(feed)
        logits = self._forward(torch.tensor([feed], device=self.device), cache)[0]
        return _Row(request, cache, len(request.prompt_ids), logits)

    def _sample(self, rows: list[_Row]) -> None:
        requests = [row.request for row in rows]
        tokens, logprobs = sample_tokens(
            torch.stack([row.logits for row in rows]),
            [r.sampling for r in requests],
            [r.generator for r in requests],
        )
        for request, token, logprob in zip(requests, tokens, logprobs, strict=True):
            request.tokens.append(token)
            request.logprobs.append(logprob)
            if token in self.eos_token_ids or token in request.sampling.stop_token_ids:
                request.finish = "stop"
            elif len(request.tokens) >= request.sampling.max_tokens:
                request.finish = "length"

    @torch.no_grad()
    def _step(self, rows: list[_Row], batch: _Batch) -> None:
        """One decode step for every active row: feed its last token at its own position."""
        batch.mask = torch.cat(
            [batch.mask, torch.ones(len(rows), 1, dtype=batch.mask.dtype, device=self.device)], 1
        )
        ids = torch.tensor([[r.request.tokens[-1]] for r in rows], device=self.device)
        positions = torch.tensor([[r.length] for r in rows], device=self.device)
        logits = self._forward(ids, batch.cache, attention_mask=batch.mask, position_ids=positions)
        self.decode_steps += 1
        for row, row_logits in zip(rows, logits, strict=True):
            row.logits = row_logits
            row.length += 1

    def _finish(self, row: _Row, batch: _Batch) -> None:
        """Keep the row's unpadded cache as its session's prefix (the prompt and every sampled token but
        the last, never fed back) and hand the result to its caller."""
        from transformers import DynamicCache

        request = row.request
        self.generated_tokens += len(request.tokens)
        if request.session is not None:
            held = request.prompt_ids + request.tokens[:-1]
            assert len(held) == row.length
            b, end = batch.rows.index(row), row.pad + row.length
            own = DynamicCache(
                ddp_cache_data=[
                    (
                        layer.keys[b : b + 1, :, row.pad : end].clone(),
                        layer.values[b : b + 1, :, row.pad : end].clone(),
                    )
                    for layer in batch.cache.layers
                ]
            )
            with self._lock:
                self._caches[request.session] = _CachedPrefix(held, own)
                while len(self._caches) > self.max_cached_sessions:
                    self._caches.popitem(last=False)
        assert request.finish is not None
        generation = Generation(request.tokens, request.logprobs, request.finish)
        request.loop.call_soon_threadsafe(_resolve, request.future, generation)


@dataclass(eq=False)
class _Row:
    request: _Request
    cache: Any  # the row's own cache until it joins the batch
    length: int  # tokens the row's cache holds
    logits: torch.Tensor
    pad: int = 0  # left padding of the row in the batch cache


class _Batch:
    """The active rows' caches as one left-padded batch cache, with its attention mask."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def admit(self, new: list[_Row], device: torch.device) -> None:
        width = max([self.mask.shape[1]] + [r.length for r in new])
        grow = width - self.mask.shape[1]
        for row in self.rows:
            row.pad += grow
        for row in new:
            row.pad = width - row.length
        parts = [(self.rows, self._layers(), grow)] if self.rows else []
        parts += [([r], [(lay.keys, lay.values) for lay in r.cache.layers], r.pad) for r in new]
        layers = len(parts[0][1])
        merged = [
            tuple(
                torch.cat([torch.nn.functional.pad(kv[i][k], (0, 0, pad, 0)) for _, kv, pad in parts])
                for k in (0, 1)
            )
            for i in range(layers)
        ]
        masks = [torch.nn.functional.pad(self.mask.to(device), (grow, 0))] if self.rows else []
        masks += [torch.tensor([[0] * r.pad + [1] * r.length], device=device) for r in new]
        self.rows = self.rows + new
        self._build(merged, torch.cat(masks))
        for row in new:
            row.cache = None

    def keep(self, rows: list[_Row]) -> None:
        """Drop finished rows, and the left padding every remaining row shares."""
        index = torch.tensor([self.rows.index(r) for r in rows])
        trim = min(r.pad for r in rows)
        for row in rows:
            row.pad -= trim
        layers = [(k[index, :, trim:], v[index, :, trim:]) for k, v in self._layers()]
        self.rows = list(rows)
        self._build(layers, self.mask[index, trim:])

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def _build(self, layers: Sequence[tuple[torch.Tensor, ...]], mask: torch.Tensor) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(ddp_cache_data=layers)
        self.mask = mask


class TransformersEngine:
    """A Ray actor body with VLLMEngine's interface, serving a transformers model from a directory: rollout
    engines on Ray where vLLM is not available (CPU hosts, the local demo, tests).

        Engine = ray.remote(TransformersEngine)
        engines = [EngineActorBackend(Engine.remote("/models/policy", [eos])) for _ in range(2)]
        backend = RoutedBackend(engines)  # cuda_agent.rollout.router
    """

    def __init__(
        self,
        model_dir: str,
        eos_token_ids: list[int],
        *,
        dtype: str = "float32",
        device: str | None = None,
        max_batch: int = 32,
    ) -> None:
        from transformers import AutoModelForCausalLM

        # No device given: the GPU when the actor sees one (Ray hides GPUs from actors without num_gpus).
        where = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.backend = TransformersBackend(model.to(where), eos_token_ids, max_batch=max_batch)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session: str | None = None
    ) -> tuple[list[int], list[float], str]:
        generation = await self.backend.generate(prompt_ids, sampling, session=session)
        return generation.token_ids, generation.logprobs, generation.finish_reason

    async def release(self, session: str) -> None:
        await self.backend.release(session)

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        await self.backend.update_weights(bucket)


def _resolve(future: asyncio.Future[Generation], generation: Generation) -> None:
    if not future.done():
        future.set_result(generation)


def _fail(future: asyncio.Future[Generation], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
