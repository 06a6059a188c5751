"""The one interface every generation backend offers the agent loop.

Token-in-token-out: a backend takes the prompt as token ids and answers with the token ids it sampled and
the log-probability of each under the sampling distribution (logits / temperature, before top-k / top-p
truncation; at temperature 0 the plain softmax). A backend that can only exchange text (a hosted chat API)
says so with `token_exact = False`, and the loop marks its trajectories accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """Per-request sampling; `max_tokens` is an upper bound the loop lowers to what the context has left."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k")
    max_tokens: int = Field(default=4096, ge=1)
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = Field(
        default=(), description="extra ids that end a turn (the backend's end-of-sequence ids always do)"
    )


@dataclass
class Generation:
    """One turn's output. `token_ids` include the stop token when the turn ended on one."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    # Chat (text) backends only: the reply as text and OpenAI-style tool calls, for the loop to parse.
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


@runtime_checkable
class GenerationBackend(Protocol):
    """What the agent loop calls. `session` is the episode id: backends that cache a prefix (the KV cache
    of the transformers backend) or route by it (sticky engine routing) use it; `release` ends it."""

    token_exact: bool

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation: ...

    async def release(self, session: str) -> None: ...


@runtime_checkable
class ChatBackend(Protocol):
    """A text-only chat API (a hosted model): the loop sends messages and OpenAI tool schemas and gets the
    reply's text and `tool_calls`. Its records are a local re-tokenization (`token_exact = False`)."""

    token_exact: bool

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sampling: SamplingParams
    ) -> Generation: ...

    async def release(self, session: str) -> None: ...
