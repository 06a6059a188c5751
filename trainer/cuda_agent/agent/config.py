"""Bounds and options of one agent episode. A TrainingRun's settings arrive as the episode contract's
`EpisodeSettings` (cuda_agent.api.episode), which `AgentConfig.for_episode` takes as they are."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.episode import EpisodeSettings
from cuda_agent.api.judge import Device, JudgeOptions
from cuda_agent.api.sandbox import JudgeStage, ToolName


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[ToolName] = Field(default_factory=lambda: list(ToolName), min_length=1)
    max_turns: int = Field(
        default=150, ge=1, description="generations per episode (CUDA Agent: 150, 200 eval)"
    )
    max_context_tokens: int = Field(default=131_072, ge=16)
    wall_clock_s: float = Field(default=7200.0, gt=0, description="generation and tools; the judge is extra")
    max_observation_chars: int = Field(
        default=16_000, ge=200, description="longer tool output keeps its head and tail around a marker"
    )
    tool_timeout_s: float = Field(
        default=660.0, gt=0, description="client-side bound on one tool call (bash's own limit is 600 s)"
    )
    session_wait_s: float = Field(
        default=600.0, ge=0, description="how long to wait for a free session slot (503) before giving up"
    )
    judge_stage: JudgeStage = "profile"
    judge_timeout_s: float = Field(default=1800.0, gt=0)
    device: Device = "cpu"
    judge: JudgeOptions = JudgeOptions()
    max_attempts: int = Field(
        default=2, ge=1, description="episodes started when the sandbox fails (a new session each time)"
    )

    @classmethod
    def for_episode(
        cls,
        episode: EpisodeSettings,
        *,
        evaluation: bool = False,
        max_turns: int | None = None,
        max_context_tokens: int | None = None,
    ) -> AgentConfig:
        """The config of one of a run's episodes: its tools, device and judge options as they are, the
        turn limit of training or evaluation episodes. A stage may set its own turns and context (the
        single-turn warm-up: one turn at `warmup.singleTurnPpo.maxContextTokens`)."""
        return cls(
            tools=list(episode.tools),
            max_turns=max_turns or episode.max_turns(evaluation),
            max_context_tokens=max_context_tokens or episode.max_context_tokens,
            device=episode.device,
            judge=episode.judge,
        )
