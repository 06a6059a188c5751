"""A backend that replays recorded replies: a scripted policy for end-to-end checks of tools, loop and
judge, and for re-running a recorded trajectory's turns against a sandbox. Replies are token ids, or
text tokenized with the policy's tokenizer (then the end-of-turn token is appended, as a model would
emit it). Log-probs are 0.0: nothing was sampled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from cuda_agent.rollout.base import FinishReason, Generation, SamplingParams


class ReplayBackend:
    token_exact = True

    def __init__(
        self,
        replies: Sequence[str | list[int]],
        tokenizer: Any = None,
        *,
        end_token_id: int | None = None,
        delay_s: float = 0.0,
        before_turn: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.replies = list(replies)
        self.tokenizer = tokenizer
        self.end_token_id = (
            end_token_id if end_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        )
        self.delay_s = delay_s
        self.before_turn = before_turn
        self._turn: dict[str, int] = {}

    def _ids(self, reply: str | list[int]) -> list[int]:
        if isinstance(reply, list):
            return list(reply)
        if self.tokenizer is None:
            raise ValueError("text replies need a tokenizer")
        ids: list[int] = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return ids + ([self.end_token_id] if self.end_token_id is not None else [])

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        key = session or ""
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        if self.before_turn is not None:
            await self.before_turn(turn)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self._ids(self.replies[turn % len(self.replies)]) if self.replies else []
        finish: FinishReason = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        elif not ids or ids[-1] != self.end_token_id:
            finish = "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish)

    async def release(self, session: str) -> None:
        self._turn.pop(session, None)
