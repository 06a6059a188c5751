"""The agent loop: one episode of the policy working in a sandbox session, as an explicit state machine

    GENERATING --tool calls--> RUNNING_TOOLS --observation--> GENERATING
    GENERATING --no tool call / a bound is reached--> JUDGING --> DONE

behind one interface in verl's shape, `await AgentLoop.run(task, sampling) -> Trajectory`.

Token-in-token-out: the prompt is tokenized once; each turn appends the engine's own token ids and
log-probs (mask 1) and then the observation's ids, tokenized as the chat template's delta (mask 0).
Bounds: max turns, max context tokens, a wall-clock budget (generation and tools); the final judge call
runs after any of them and its milestone reward is the episode's reward (-1 when the judge produced no
result). Bad model output never raises: malformed, truncated, unknown or ill-typed tool calls become
error observations and are counted. A sandbox that fails (server gone, session lost, no capacity) ends
the attempt as `sandbox_error`; the loop then starts the episode again in a new session on the next
sandbox, up to `max_attempts`, and a record that still ends in `sandbox_error` says so (never lost, and
the trainer must not learn from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import aiohttp
from pydantic import BaseModel

from cuda_agent.agent.chat import ChatCodec
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.parsing import CallError, ParsedCall, parse_hermes, parse_openai
from cuda_agent.agent.prompt import system_message, task_message
from cuda_agent.agent.records import TrajectoryWriter
from cuda_agent.agent.tools import ToolArgumentError, resolve, validate_arguments
from cuda_agent.agent.trajectory import EpisodeEnd, JudgeVerdict, Trajectory, TurnRecord
from cuda_agent.api.sandbox import JudgeRun, SessionInfo, TaskRef, ToolName
from cuda_agent.rollout.base import ChatBackend, Generation, GenerationBackend, SamplingParams
from cuda_agent.sandbox.client import SandboxClient, SandboxError
from cuda_agent.telemetry import Stage, current_ids, linked_root_span, record_episode, span
from cuda_agent.telemetry.metrics import EPISODES_IN_FLIGHT
from cuda_agent.telemetry.tracing import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)

log = logging.getLogger(__name__)

# Status codes after which the session cannot go on: gone (server restarted), no capacity, a proxy
# that lost the pod. Other errors (a 500 from one request) are observations the policy reads.
_SESSION_LOST = frozenset({404, 502, 503, 504})
_READ_WORKSPACE = "cat SKILL.md; printf '\\n%s\\n' '{sep}'; cat model.py"


class EpisodeState(StrEnum):
    GENERATING = "generating"
    RUNNING_TOOLS = "running_tools"
    JUDGING = "judging"
    DONE = "done"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot continue this session."""


def truncate_observation(text: str, limit: int) -> str:
    """Head and tail of `text` around a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = text[len(text) - (limit - head) :]
    return f"{text[:head]}\n[... {len(text) - limit} characters cut by the agent loop ...]\n{tail}"


def _as_unavailable(exc: BaseException) -> SandboxUnavailable | None:
    if isinstance(exc, SandboxError) and exc.status in _SESSION_LOST:
        return SandboxUnavailable(str(exc))
    if isinstance(exc, aiohttp.ClientError | ConnectionError):
        return SandboxUnavailable(f"sandbox unreachable: {exc!r}")
    return None


def verdict_of(run: JudgeRun) -> JudgeVerdict:
    result = run.result
    if result is None:
        return JudgeVerdict(reward=-1, summary=run.error or run.text or "the judge produced no result")
    return JudgeVerdict(
        reward=result.reward,
        correct=result.correct,
        speedup_vs_eager=result.speedup.get("eager"),
        speedup_vs_compile=result.speedup.get("compile"),
        violations=list(result.violations),
        summary=run.text or (result.error or ""),
    )


class AgentLoop:
    """Runs episodes of one policy backend against one or more sandbox servers; safe to call `run`
    from hundreds of concurrent tasks (all waiting is on the event loop)."""

    def __init__(
        self,
        backend: GenerationBackend | ChatBackend,
        sandboxes: SandboxClient | Sequence[SandboxClient],
        codec: ChatCodec,
        config: AgentConfig | None = None,
        writer: TrajectoryWriter | None = None,
    ) -> None:
        self.backend = backend
        self.sandboxes = [sandboxes] if isinstance(sandboxes, SandboxClient) else list(sandboxes)
        if not self.sandboxes:
            raise ValueError("at least one sandbox client is needed")
        self.codec = codec
        self.config = config or AgentConfig()
        self.writer = writer
        self._next_sandbox = 0

    async def run(self, task: TaskRef, sampling: SamplingParams, episode_id: str | None = None) -> Trajectory:
        episode_id = episode_id or uuid.uuid4().hex[:16]
        started = time.monotonic()
        trajectory: Trajectory | None = None
        with EPISODES_IN_FLIGHT.track_inprogress():
            for attempt in range(1, self.config.max_attempts + 1):
                sandbox = self.sandboxes[self._next_sandbox % len(self.sandboxes)]
                self._next_sandbox += 1
                episode = _Episode(self, sandbox, task, sampling, episode_id, attempt)
                trajectory = await episode.run()
                if trajectory.end != "sandbox_error":
                    break
                log.warning(
                    "episode attempt failed in the sandbox",
                    extra={
                        "episode_id": episode_id,
                        "attempt": attempt,
                        "error": trajectory.error,
                        "episode_trace_id": trajectory.trace_id,
                    },
                )
        assert trajectory is not None
        trajectory.wall_s = time.monotonic() - started
        record_episode(trajectory.end, trajectory.reward, trajectory.wall_s, sum(trajectory.loss_mask))
        if self.writer is not None:
            await self.writer.write(trajectory)
        return trajectory


class _Episode:
    """One attempt: a session, the token sequence so far, and the state machine's steps."""

    def __init__(
        self,
        loop: AgentLoop,
        sandbox: SandboxClient,
        task: TaskRef,
        sampling: SamplingParams,
        episode_id: str,
        attempt: int,
    ) -> None:
        self.loop = loop
        self.cfg = loop.config
        self.codec = loop.codec
        self.sandbox = sandbox
        self.task = task
        self.episode_id = episode_id
        self.attempt = attempt
        stops = tuple(sorted(set(sampling.stop_token_ids) | self.codec.stop_token_ids))
        self.sampling = sampling.model_copy(update={"stop_token_ids": stops})
        self.session_id: str | None = None
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_length = 0
        self.turns: list[TurnRecord] = []
        self.invalid = Counter[str]()
        self.end: EpisodeEnd = "finished"
        self.error: str | None = None
        self.verdict: JudgeVerdict | None = None
        self.deadline = 0.0
        self.pending: Generation | None = None
        self.pending_calls: list[ParsedCall] = []
        self.generate_s = 0.0
        # A chat API (hosted model) gets the conversation as messages; token backends never need them.
        self.chat = loop.backend if isinstance(loop.backend, ChatBackend) else None
        self.messages: list[dict[str, Any]] = []
        self.trace_ids: tuple[str, str] | None = None  # the episode's (trace_id, span_id) when traced

    # ------------------------------------------------------------------ driver

    async def run(self) -> Trajectory:
        # The episode starts a trace of its own, linked to the caller's span (the trainer's step): one
        # trace per episode stays readable, where one per run would grow without bound.
        with linked_root_span(
            Stage.EPISODE, episode_id=self.episode_id, task=self.task.name, attempt=self.attempt
        ) as sp:
            self.trace_ids = current_ids()
            try:
                state = await self._start()
                while state is not EpisodeState.DONE:
                    if state is EpisodeState.JUDGING:
                        state = await self._judge()
                        continue
                    # One turn span holds a generation and the tool calls it made.
                    with span(Stage.TURN, episode_id=self.episode_id, turn=len(self.turns)):
                        if state is EpisodeState.GENERATING:
                            state = await self._generate()
                        if state is EpisodeState.RUNNING_TOOLS:
                            state = await self._run_tools()
            except SandboxUnavailable as exc:
                self._stop("sandbox_error", str(exc))
            finally:
                await self._cleanup()
            trajectory = self._trajectory()
            sp.set_attribute("cuda_agent.reward", trajectory.reward)
            sp.set_attribute("cuda_agent.end", trajectory.end)
            sp.set_attribute("cuda_agent.turns", len(trajectory.turns))
            return trajectory

    def _stop(self, end: EpisodeEnd, error: str | None = None) -> EpisodeState:
        self.end = end
        self.error = error
        return EpisodeState.DONE if end == "sandbox_error" else EpisodeState.JUDGING

    async def _sandbox(self, call: Any, timeout_s: float) -> Any:
        """A sandbox request; failures that end the session raise SandboxUnavailable."""
        try:
            return await asyncio.wait_for(call, timeout_s)
        except (SandboxError, aiohttp.ClientError, ConnectionError) as exc:
            lost = _as_unavailable(exc)
            if lost is not None:
                raise lost from exc
            raise

    async def _start(self) -> EpisodeState:
        try:
            return await self._open_session()
        except TimeoutError:
            raise SandboxUnavailable("the sandbox did not open a session in time") from None

    async def _open_session(self) -> EpisodeState:
        session = await self._create_session()
        self.deadline = time.monotonic() + self.cfg.wall_clock_s  # waiting for a slot is not the policy's
        self.session_id = session.session_id
        sep = f"--- cuda-agent {uuid.uuid4().hex} ---"
        seeded = await self._sandbox(
            self.sandbox.tool(
                session.session_id, ToolName.BASH, {"command": _READ_WORKSPACE.format(sep=sep)}
            ),
            self.cfg.tool_timeout_s,
        )
        if seeded.is_error or sep not in seeded.output:
            raise SandboxUnavailable(f"the workspace has no SKILL.md / model.py: {seeded.output[:300]}")
        skill, model_source = seeded.output.split(f"\n{sep}\n", 1)
        system, user = system_message(skill), task_message(self.task.name, model_source)
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.token_ids = self.codec.prompt_ids(system, user)
        self.prompt_length = len(self.token_ids)
        self.loss_mask = [0] * self.prompt_length
        self.logprobs = [0.0] * self.prompt_length
        if self.prompt_length >= self.cfg.max_context_tokens:
            return self._stop("max_context", f"the prompt alone has {self.prompt_length} tokens")
        return EpisodeState.GENERATING

    async def _create_session(self) -> SessionInfo:
        """A new session; while the server is full (503) wait with backoff, up to `session_wait_s`, as
        episodes beyond a pool's capacity queue for slots (the autoscaler sees the queue)."""
        waited, pause = 0.0, 0.2
        while True:
            create = self.sandbox.create_session(
                self.task.source,
                task_uri=self.task.uri,
                device=self.cfg.device,
                judge=self.cfg.judge,
                name=self.task.name,
            )
            try:
                session: SessionInfo = await asyncio.wait_for(create, self.cfg.tool_timeout_s)
                return session
            except SandboxError as exc:
                if exc.status != 503 or waited >= self.cfg.session_wait_s:
                    lost = _as_unavailable(exc)
                    if lost is not None:
                        raise lost from exc
                    raise
            except (aiohttp.ClientError, ConnectionError) as exc:
                raise SandboxUnavailable(f"sandbox unreachable: {exc!r}") from exc
            await asyncio.sleep(pause)
            waited += pause
            pause = min(pause * 2, 5.0)

    # ------------------------------------------------------------------ states

    async def _generate(self) -> EpisodeState:
        if len(self.turns) >= self.cfg.max_turns:
            return self._stop("max_turns")
        room = self.cfg.max_context_tokens - len(self.token_ids)
        if room <= 0:
            return self._stop("max_context")
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return self._stop("wall_clock")
        seed = self.sampling.seed
        update = {
            "max_tokens": min(self.sampling.max_tokens, room),
            # A fixed seed makes the episode reproducible; each turn still draws a fresh stream.
            "seed": None if seed is None else seed + 1000 * (self.attempt - 1) + len(self.turns),
        }
        sampling = self.sampling.model_copy(update=update)
        started = time.monotonic()
        with span(Stage.GENERATE, episode_id=self.episode_id, prompt_tokens=len(self.token_ids)) as sp:
            try:
                if self.chat is not None:
                    reply = self.chat.chat(self.messages, self.codec.tools, sampling)
                else:
                    assert isinstance(self.loop.backend, GenerationBackend)
                    reply = self.loop.backend.generate(self.token_ids, sampling, session=self.episode_id)
                generation = await asyncio.wait_for(reply, remaining)
                if self.chat is not None:
                    generation = self._tokenize_chat_reply(generation)
            except TimeoutError:
                return self._stop("wall_clock", "the wall-clock budget ran out during generation")
            except Exception as exc:  # an engine failure ends the episode, never the caller's batch
                log.exception("generation failed", extra={"episode_id": self.episode_id})
                return self._stop("generation_error", f"{type(exc).__name__}: {exc}")
            sp.set_attribute("cuda_agent.generated_tokens", len(generation.token_ids))
            sp.set_attribute("cuda_agent.finish_reason", generation.finish_reason)
            # OpenTelemetry's GenAI semantic conventions, which LLM-aware backends read.
            sp.set_attributes(
                {
                    GEN_AI_OPERATION_NAME: "chat" if self.chat is not None else "text_completion",
                    GEN_AI_USAGE_INPUT_TOKENS: len(self.token_ids),
                    GEN_AI_USAGE_OUTPUT_TOKENS: len(generation.token_ids),
                    GEN_AI_RESPONSE_FINISH_REASONS: (generation.finish_reason,),
                }
            )
        self.generate_s = time.monotonic() - started
        self.token_ids += generation.token_ids
        self.loss_mask += [1] * len(generation.token_ids)
        self.logprobs += generation.logprobs
        if generation.tool_calls:
            calls = parse_openai(generation.tool_calls)
        else:
            text = generation.text if generation.text is not None else self.codec.decode(generation.token_ids)
            calls = parse_hermes(text)
        self.pending, self.pending_calls = generation, calls
        if not calls and generation.finish_reason != "length":
            self._record_turn(0, [], 0, 0.0)
            return self._stop("finished")
        if len(self.token_ids) >= self.cfg.max_context_tokens:  # no room left for any observation
            self._record_turn(0, [], 0, 0.0)
            return self._stop("max_context")
        return EpisodeState.RUNNING_TOOLS

    async def _run_tools(self) -> EpisodeState:
        generation = self.pending
        assert generation is not None
        started = time.monotonic()
        messages: list[dict[str, Any]] = []
        names: list[str] = []
        errors = 0
        if not self.pending_calls:  # cut at the token limit without a complete call
            messages.append(
                {
                    "role": "user",
                    "content": f"[Your reply reached the limit of {len(generation.token_ids)} tokens "
                    "without a tool call. Continue, or stop calling tools to be judged.]",
                }
            )
        for call in self.pending_calls:
            output, failed = await self._call_tool(call)
            errors += failed
            names.append(call.name or "?")
            content = truncate_observation(output, self.cfg.max_observation_chars)
            messages.append(self.codec.tool_message(content, call.name, call.call_id))
            if self.chat is not None:  # a chat API answers every tool call id with a tool message
                role = {"role": "tool", "tool_call_id": call.call_id} if call.call_id else {"role": "user"}
                self.messages.append({**role, "content": content})
        if self.chat is not None and not self.pending_calls:
            self.messages.append(messages[0])
        tools_s = time.monotonic() - started
        last = generation.token_ids[-1] if generation.token_ids else None
        observation = self.codec.observation_ids(messages, last)
        self._record_turn(len(observation), names, errors, tools_s)
        if len(self.token_ids) + len(observation) >= self.cfg.max_context_tokens:
            return self._stop("max_context")
        self.token_ids += observation
        self.loss_mask += [0] * len(observation)
        self.logprobs += [0.0] * len(observation)
        if time.monotonic() >= self.deadline:
            return self._stop("wall_clock")
        return EpisodeState.GENERATING

    def _tokenize_chat_reply(self, generation: Generation) -> Generation:
        """A chat API's reply as the policy's chat template would hold it (text, then Hermes tool-call
        blocks, then the end-of-turn token): the record of a text-only backend, not the model's ids."""
        assistant: dict[str, Any] = {"role": "assistant", "content": generation.text or ""}
        blocks = []
        for raw in generation.tool_calls:
            function = raw.get("function") if isinstance(raw, dict) else None
            if isinstance(function, dict):
                arguments = function.get("arguments")
                with contextlib.suppress(json.JSONDecodeError):  # else kept as the string the model wrote
                    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                call = {"name": function.get("name"), "arguments": arguments}
                blocks.append(f"\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>")
        if generation.tool_calls:
            assistant["tool_calls"] = generation.tool_calls
        self.messages.append(assistant)
        ids = self.codec.encode((generation.text or "") + "".join(blocks))
        if generation.finish_reason == "stop" and self.codec.tokenizer.eos_token_id is not None:
            ids.append(self.codec.tokenizer.eos_token_id)
        generation.token_ids, generation.logprobs = ids, [0.0] * len(ids)
        return generation

    async def _call_tool(self, call: ParsedCall) -> tuple[str, int]:
        """(observation text, 1 if it was an error else 0)."""
        if isinstance(call, CallError):
            return self._invalid(call.kind, f"Error: {call.message}")
        tool = resolve(call.name, self.cfg.tools)
        if tool is None:
            known = ", ".join(t["function"]["name"] for t in self.codec.tools)
            return self._invalid("unknown_tool", f"Error: unknown tool {call.name!r}; available: {known}")
        try:
            arguments: BaseModel = validate_arguments(tool, call.arguments)
        except ToolArgumentError as exc:
            return self._invalid("invalid_arguments", f"Error: {call.name}: {exc}")
        assert self.session_id is not None
        timeout = min(self.cfg.tool_timeout_s, max(self.deadline - time.monotonic(), 1.0))
        with span(Stage.TOOL_CALL, episode_id=self.episode_id, tool=str(tool)) as sp:
            try:
                result = await self._sandbox(self.sandbox.tool(self.session_id, tool, arguments), timeout)
            except TimeoutError:
                sp.set_attribute("cuda_agent.timed_out", True)
                return f"Error: the {call.name} call did not finish within {timeout:.0f} s", 1
            except SandboxError as exc:  # a request the server refused but survived
                return f"Error: {call.name} failed: {exc.message}", 1
            sp.set_attribute("cuda_agent.is_error", result.is_error)
        return result.output, int(result.is_error)

    def _invalid(self, kind: str, message: str) -> tuple[str, int]:
        self.invalid[kind] += 1
        return message, 1

    async def _judge(self) -> EpisodeState:
        assert self.session_id is not None
        with span(Stage.JUDGE, episode_id=self.episode_id, stage=self.cfg.judge_stage) as sp:
            try:
                run = await self._sandbox(
                    self.sandbox.judge(self.session_id, self.cfg.judge_stage), self.cfg.judge_timeout_s
                )
            except TimeoutError:
                self.verdict = JudgeVerdict(reward=-1, summary="the final judge call timed out")
                return EpisodeState.DONE
            except SandboxError as exc:
                self.verdict = JudgeVerdict(reward=-1, summary=f"the final judge call failed: {exc.message}")
                return EpisodeState.DONE
            self.verdict = verdict_of(run)
            sp.set_attribute("cuda_agent.reward", self.verdict.reward)
        return EpisodeState.DONE

    # ------------------------------------------------------------------ bookkeeping

    def _record_turn(self, observation_tokens: int, names: list[str], errors: int, tools_s: float) -> None:
        generated = len(self.pending.token_ids) if self.pending is not None else 0
        self.turns.append(
            TurnRecord(
                generated_tokens=generated,
                observation_tokens=observation_tokens,
                tool_calls=names,
                tool_errors=errors,
                generate_s=self.generate_s,
                tools_s=tools_s,
            )
        )

    async def _cleanup(self) -> None:
        await self.loop.backend.release(self.episode_id)
        if self.session_id is None:
            return
        try:
            await asyncio.wait_for(self.sandbox.delete_session(self.session_id), 60)
        except (SandboxError, aiohttp.ClientError, OSError) as exc:  # the server may be gone; its TTL reaps
            log.warning("could not delete session", extra={"session_id": self.session_id, "error": repr(exc)})

    def _trajectory(self) -> Trajectory:
        verdict = self.verdict
        return Trajectory(
            episode_id=self.episode_id,
            task_name=self.task.name,
            prompt_length=self.prompt_length,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            reward=float(verdict.reward) if verdict is not None else -1.0,
            verdict=verdict,
            end=self.end,
            turns=self.turns,
            invalid_tool_calls=sum(self.invalid.values()),
            invalid_tool_call_kinds=dict(self.invalid),
            token_exact=self.loop.backend.token_exact,
            attempts=self.attempt,
            error=self.error,
            trace_id=self.trace_ids[0] if self.trace_ids else None,
            span_id=self.trace_ids[1] if self.trace_ids else None,
        )
