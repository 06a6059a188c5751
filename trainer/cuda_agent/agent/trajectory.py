"""The agent loop <-> trainer contract: one episode as token ids, masks, log-probs and its reward.

Token-in-token-out: `token_ids` is the exact sequence the policy saw and produced (prompt, then each turn's
generated tokens and the observation tokens that followed), never text re-tokenized between turns.
`loss_mask[i] == 1` marks a token the policy generated (it gets a PPO loss); 0 marks prompt, tool output
and chat-template tokens the loop inserted. `logprobs[i]` is the engine's log-probability of token i where
`loss_mask[i] == 1`, else 0.0. The trainer consumes this record; it is written as JSON lines to MinIO or a
local path (`to_json` / `from_json`).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

EpisodeEnd = Literal[
    "finished",  # the policy stopped calling tools (or called the final judge)
    "max_turns",
    "max_context",
    "wall_clock",
    "sandbox_error",  # the sandbox failed in a way a retry did not fix
    "generation_error",
]


class TurnRecord(BaseModel):
    """Timings and counts of one turn (one generation and the tool calls it made)."""

    model_config = ConfigDict(extra="forbid")

    generated_tokens: int = Field(ge=0)
    observation_tokens: int = Field(ge=0)
    tool_calls: list[str] = Field(default_factory=list, description="Tool names called in this turn.")
    tool_errors: int = Field(default=0, ge=0, description="Malformed, unknown or failed calls.")
    generate_s: float = Field(ge=0)
    tools_s: float = Field(ge=0)


class JudgeVerdict(BaseModel):
    """What the final judge call said (a subset of the judge's result, enough for metrics and filters)."""

    model_config = ConfigDict(extra="forbid")

    reward: int = Field(ge=-1, le=3)
    correct: bool = False
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    violations: list[str] = Field(default_factory=list)
    summary: str = ""


class Trajectory(BaseModel):
    """One episode, ready for the trainer."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    task_name: str
    prompt_length: int = Field(ge=0, description="token_ids[:prompt_length] is the initial prompt.")
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float = Field(description="Episode reward: the judge's milestone reward, -1 when nothing valid.")
    verdict: JudgeVerdict | None = None
    end: EpisodeEnd
    turns: list[TurnRecord] = Field(default_factory=list)
    invalid_tool_calls: int = Field(default=0, ge=0)
    wall_s: float = Field(default=0.0, ge=0)
    # Added by the agent loop (issue 14); all optional, so records written before still load.
    invalid_tool_call_kinds: dict[str, int] = Field(
        default_factory=dict, description="invalid_tool_calls by kind: malformed, truncated, unknown_tool..."
    )
    token_exact: bool = Field(
        default=True,
        description="False when the backend exchanged text (an HTTP endpoint without token ids): token_ids "
        "are then a re-tokenization and logprobs may be 0.0; not fit for PPO.",
    )
    attempts: int = Field(default=1, ge=1, description="Episodes started for this record (sandbox retries).")
    error: str | None = Field(default=None, description="Why the episode ended early, when it did.")
    # Each episode is a trace of its own (docs/telemetry.md); its ids come back with the record so the
    # step span can link to it and a record can be looked up in the tracing backend.
    trace_id: str | None = Field(
        default=None, description="The episode's trace (32 hex digits); None when tracing was off."
    )
    span_id: str | None = Field(default=None, description="The episode's root span (16 hex digits).")

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and logprobs ({len(self.logprobs)}) "
                "must have the same length"
            )
        if self.prompt_length > n:
            raise ValueError(f"prompt_length {self.prompt_length} exceeds the {n} tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask holds only 0 and 1")
        if any(self.loss_mask[: self.prompt_length]):
            raise ValueError("prompt tokens cannot carry loss")
        return self

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.model_validate_json(line)
