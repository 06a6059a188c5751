"""A policy through the agent loop (cuda_agent.agent.AgentLoop, unchanged) and the sandbox's judge, one
episode per task; the episode's final judge call is the row's verdict.

Policy specs (`--policy KIND:TARGET`):

    replay:FILE          recorded replies (cuda_agent.rollout.replay): a JSON list of reply texts used for
                         every task, or an object task name -> list
    hf:DIR               a transformers causal LM from a local directory (cuda_agent.rollout.hf)
    openai:URL           an OpenAI-compatible completions endpoint, token ids in and out (vLLM's server)
    openai-text:URL      the same endpoint exchanging text (not token-exact)
    openai-chat:URL      a chat completions endpoint with tools (hosted models)

The chat template is the tokenizer's (`--tokenizer DIR`, default the hf model's directory).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.eval.models import TaskResult
from cuda_agent.eval.tasks import Task

PolicyKind = Literal["replay", "hf", "openai", "openai-text", "openai-chat"]


class PolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PolicyKind
    target: str = Field(min_length=1)
    model: str | None = Field(default=None, description="model name an OpenAI-compatible server expects")
    tokenizer: Path | None = None
    gguf_file: str | None = None
    api_key_env: str = "OPENAI_API_KEY"

    @classmethod
    def parse(cls, spec: str, **options: Any) -> PolicySpec:
        kind, sep, target = spec.partition(":")
        kinds: dict[str, PolicyKind] = {k: k for k in _KINDS}
        if not sep:
            raise ValueError(f"--policy {spec!r}: expected KIND:TARGET with KIND one of {', '.join(_KINDS)}")
        if kind not in kinds:
            raise ValueError(f"--policy {spec!r}: unknown kind {kind!r}; kinds: {', '.join(_KINDS)}")
        return cls(kind=kinds[kind], target=target, **options)

    @property
    def tokenizer_dir(self) -> Path:
        if self.tokenizer is not None:
            return self.tokenizer
        if self.kind == "hf":
            return Path(self.target)
        raise ValueError(f"--policy {self.kind}:...: give the policy's tokenizer with --tokenizer DIR")


_KINDS: tuple[PolicyKind, ...] = ("replay", "hf", "openai", "openai-text", "openai-chat")


def load_codec(spec: PolicySpec, tools: list[str]) -> Any:
    """The policy's chat template and tokenizer with the offered tools (cuda_agent.agent.ChatCodec)."""
    from transformers import AutoTokenizer

    from cuda_agent.agent.chat import ChatCodec
    from cuda_agent.agent.tools import openai_tools
    from cuda_agent.api.sandbox import ToolName

    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir, gguf_file=spec.gguf_file)
    return ChatCodec(tokenizer, openai_tools([ToolName(t) for t in tools]))


def replay_script(path: Path) -> dict[str, list[str]] | list[str]:
    """The replies of a replay policy: a list for every task, or task name -> list."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--policy replay:{path}: {exc}") from None
    if isinstance(data, list) and all(isinstance(r, str) for r in data):
        return data
    if isinstance(data, dict) and all(
        isinstance(v, list) and all(isinstance(r, str) for r in v) for v in data.values()
    ):
        return {str(k): list(v) for k, v in data.items()}
    raise ValueError(f"--policy replay:{path}: expected a JSON list of strings or an object of such lists")


class PolicyBackends:
    """The generation backend for each task's episode (one shared backend, or a replay script per task)."""

    def __init__(self, spec: PolicySpec, codec: Any, device: str) -> None:
        self.spec = spec
        self.codec = codec
        self.shared: Any = None
        self.script: dict[str, list[str]] | list[str] | None = None
        if spec.kind == "replay":
            self.script = replay_script(Path(spec.target))
        elif spec.kind == "hf":
            import torch
            from transformers import AutoModelForCausalLM

            from cuda_agent.rollout.hf import TransformersBackend

            model: Any = AutoModelForCausalLM.from_pretrained(spec.target, gguf_file=spec.gguf_file)
            self.shared = TransformersBackend(model.to(torch.device(device)), codec.stop_token_ids)
        else:
            from cuda_agent.rollout.openai_http import OpenAIChatBackend, OpenAICompatibleBackend

            if not spec.model:
                raise ValueError(
                    f"--policy {spec.kind}:{spec.target}: give the served model's name with --model"
                )
            key = os.environ.get(spec.api_key_env)
            if spec.kind == "openai-chat":
                self.shared = OpenAIChatBackend(spec.target, spec.model, api_key=key)
            else:
                mode: Literal["tokens", "text"] = "text" if spec.kind == "openai-text" else "tokens"
                self.shared = OpenAICompatibleBackend(
                    spec.target, spec.model, mode=mode, tokenizer=codec.tokenizer, api_key=key
                )

    def for_task(self, task: Task) -> Any:
        from cuda_agent.rollout.replay import ReplayBackend

        if self.script is None:
            return self.shared
        replies = self.script if isinstance(self.script, list) else self.script.get(task.name, [])
        return ReplayBackend(replies, self.codec.tokenizer)

    async def close(self) -> None:
        close = getattr(self.shared, "close", None)
        if close is not None:
            outcome = close()
            if hasattr(outcome, "__await__"):
                await outcome


@contextmanager
def local_sandbox() -> Iterator[str]:
    """A sandbox server on this machine with the installed real judge and the server's defaults
    (cuda_agent.sandbox.local, as the trainer's demonstrations start theirs), for runs given no --sandbox
    URL."""
    from cuda_agent.sandbox.local import local_server

    # A root-mode server binds tmpfs over /tmp for its children, so its state must live elsewhere.
    parent = Path("/var/lib/cuda-agent-eval") if os.geteuid() == 0 else None
    with local_server(None, parent) as url:
        yield url


def episode_row(task: Task, trajectory: Any) -> TaskResult:
    """The results.jsonl row of one episode (cuda_agent.agent.Trajectory)."""
    verdict = trajectory.verdict
    summary = verdict.summary if verdict is not None else (trajectory.error or "")
    error = None
    if verdict is None or verdict.reward < 1:
        error = _reason(summary) or trajectory.error
    return TaskResult(
        key=task.key,
        level=task.level,
        task=task.name,
        candidate=trajectory.episode_id,
        status="judged" if verdict is not None and trajectory.end != "sandbox_error" else "no-result",
        reward=int(verdict.reward) if verdict is not None else -1,
        compiled="compiled: yes" in summary,
        correct=bool(verdict and verdict.correct),
        violations=list(verdict.violations) if verdict is not None else [],
        error=error,
        speedup_eager=verdict.speedup_vs_eager if verdict is not None else None,
        speedup_compile=verdict.speedup_vs_compile if verdict is not None else None,
        seconds=round(trajectory.wall_s, 3),
        episode_end=trajectory.end,
        turns=len(trajectory.turns),
    )


def _reason(summary: str) -> str | None:
    """The judge summary's error line (the server's text: `error: ...`), else its last line."""
    match = re.search(r"^error: (.+)$", summary, re.MULTILINE)
    if match:
        return match.group(1)[:500]
    lines = [line for line in summary.splitlines() if line.strip()]
    return lines[-1][:500] if lines else None
