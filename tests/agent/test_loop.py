"""The agent loop against a real sandbox server (fake judge: these tests are about the loop; the real
judge's end-to-end episode is in test_episode_real_judge.py). Policies: a tiny random-init Llama with
SmolLM2's real tokenizer and chat template, or a scripted policy replaying fixed replies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from agent_helpers import EXAMPLES, start_sandbox
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sandbox_helpers import RunningServer, cleanup

from cuda_agent.agent import AgentConfig, AgentLoop, ChatCodec, Trajectory, TrajectoryWriter, openai_tools
from cuda_agent.agent.records import read_trajectories
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.rollout import Generation, SamplingParams
from cuda_agent.rollout.hf import TransformersBackend
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.client import SandboxClient
from cuda_agent.telemetry import configure_tracing

TASK = TaskRef(source=(EXAMPLES / "tasks" / "relu_mul_add.py").read_text(), name="relu_mul_add")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def codec(tokenizer: Any) -> ChatCodec:
    return ChatCodec(tokenizer, openai_tools(AgentConfig().tools))


def run_episode(
    server: RunningServer | list[RunningServer],
    backend: Any,
    codec: ChatCodec,
    config: AgentConfig,
    sampling: SamplingParams | None = None,
    writer: TrajectoryWriter | None = None,
) -> Trajectory:
    servers = server if isinstance(server, list) else [server]

    async def main() -> Trajectory:
        clients = [SandboxClient(s.url) for s in servers]
        try:
            loop = AgentLoop(backend, clients, codec, config, writer)
            trajectory = await loop.run(TASK, sampling or SamplingParams(max_tokens=256))
            if writer is not None:
                await writer.close()
            return trajectory
        finally:
            for client in clients:
                await client.close()

    return asyncio.run(main())


def segments(trajectory: Trajectory) -> list[tuple[int, list[int]]]:
    """(mask value, ids) runs after the prompt."""
    runs: list[tuple[int, list[int]]] = []
    for token, mask in zip(
        trajectory.token_ids[trajectory.prompt_length :],
        trajectory.loss_mask[trajectory.prompt_length :],
        strict=True,
    ):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    return runs


def observations(trajectory: Trajectory, codec: ChatCodec) -> list[str]:
    return [codec.decode(ids) for mask, ids in segments(trajectory) if mask == 0]


class Recorder:
    """Passes every call to the real engine and keeps what it returned, to compare with the record."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.token_exact = backend.token_exact
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None):
        generation = await self.backend.generate(prompt_ids, sampling, session=session)
        self.calls.append((list(prompt_ids), generation))
        return generation

    async def release(self, session: str) -> None:
        await self.backend.release(session)


def test_tiny_model_episode_records_exactly_what_the_engine_produced(
    sandbox_server: RunningServer, codec: ChatCodec, tiny_model: Any, tmp_path: Path
) -> None:
    engine = TransformersBackend(tiny_model, codec.stop_token_ids)
    recorder = Recorder(engine)
    writer = TrajectoryWriter(str(tmp_path / "records"))
    sampling = SamplingParams(temperature=0.8, top_k=50, max_tokens=12, seed=7)
    trajectory = run_episode(sandbox_server, recorder, codec, AgentConfig(max_turns=3), sampling, writer)

    # Every engine call's prompt is exactly the record so far: nothing was re-tokenized between turns.
    assert len(recorder.calls) == len(trajectory.turns) >= 1
    position = trajectory.prompt_length
    for prompt, generation in recorder.calls:
        assert prompt == trajectory.token_ids[: len(prompt)]
        position = len(prompt)
        n = len(generation.token_ids)
        assert trajectory.token_ids[position : position + n] == generation.token_ids
        assert trajectory.logprobs[position : position + n] == generation.logprobs
        assert trajectory.loss_mask[position : position + n] == [1] * n
    assert sum(trajectory.loss_mask) == sum(len(g.token_ids) for _, g in recorder.calls)
    assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m == 0)

    # The engine's log-probs are the model's: one full forward over the final sequence (no KV cache)
    # gives the same values at every policy token.
    ids = torch.tensor([trajectory.token_ids])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    for i, (mask, lp) in enumerate(zip(trajectory.loss_mask, trajectory.logprobs, strict=True)):
        if mask:
            assert abs(float(logp[i - 1, trajectory.token_ids[i]]) - lp) < 1e-4, i

    prompt = codec.decode(trajectory.token_ids[: trajectory.prompt_length])
    assert "name: kernel-optimization" not in prompt and "Skill `kernel-optimization`" in prompt
    assert (
        "atol = rtol = 1e-2" in prompt and "class Model(nn.Module)" in prompt and '"name": "Bash"' in prompt
    )
    assert trajectory.end in ("max_turns", "finished") and trajectory.verdict is not None
    assert [t.model_dump() for t in read_trajectories(str(tmp_path / "records"))] == [trajectory.model_dump()]


def test_scripted_episode_uses_the_tools_and_ends_with_the_judge(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    replies = [
        "I will look first.\n"
        + call("Glob", pattern="**/*.h")
        + call("Bash", command="echo hello-from-bash"),
        call("Write", file_path="notes/plan.txt", content="fuse relu(a*b)+c\n"),
        call("Edit", file_path="notes/plan.txt", old_string="fuse", new_string="FUSE"),
        call("Read", file_path="notes/plan.txt")
        + call("Grep", pattern="FUSE", path="notes", output_mode="content")
        + call("TodoWrite", todos=[{"content": "write kernel", "status": "in_progress", "activeForm": "x"}]),
        call("Bash", command="head -c 20000 /dev/zero | tr '\\0' x; echo; echo END-OF-OUTPUT"),
        "Done.",
    ]
    trajectory = run_episode(sandbox_server, ReplayBackend(replies, tokenizer), codec, AgentConfig())
    assert trajectory.end == "finished" and len(trajectory.turns) == 6
    assert [t.tool_calls for t in trajectory.turns] == [
        ["Glob", "Bash"],
        ["Write"],
        ["Edit"],
        ["Read", "Grep", "TodoWrite"],
        ["Bash"],
        [],
    ]
    seen = observations(trajectory, codec)
    assert "binding_registry.h" in seen[0] and "hello-from-bash" in seen[0]
    assert "FUSE relu(a*b)+c" in seen[3] and trajectory.invalid_tool_calls == 0
    # A long observation keeps its head and tail around the loop's marker.
    assert "characters cut by the agent loop" in seen[4] and "END-OF-OUTPUT" in seen[4]
    assert len(seen[4]) < 16_500
    # The policy ended on <|im_end|>; the template's newline after it opens the observation.
    assert seen[0].startswith("\n<|im_start|>tool\n") and seen[0].endswith("<|im_start|>assistant\n")
    assert trajectory.verdict is not None and trajectory.reward == trajectory.verdict.reward


def test_bad_tool_calls_become_counted_observations(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    truncated = tokenizer('<tool_call>\n{"name": "Bash", "arguments": {"comm', add_special_tokens=False)
    replies: list[str | list[int]] = [
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"</tool_call>',
        call("Compile", target="all"),
        call("Write", file_path="x.txt"),
        truncated["input_ids"],
        "<tool_call>[1, 2]</tool_call>" + call("Bash", command="echo still-alive"),
        "Stopping.",
    ]
    trajectory = run_episode(sandbox_server, ReplayBackend(replies, tokenizer), codec, AgentConfig())
    assert trajectory.end == "finished" and len(trajectory.turns) == 6
    assert trajectory.invalid_tool_call_kinds == {
        "malformed": 2,
        "unknown_tool": 1,
        "invalid_arguments": 1,
        "truncated": 1,
    }
    assert trajectory.invalid_tool_calls == 5
    assert [t.tool_errors for t in trajectory.turns] == [1, 1, 1, 1, 1, 0]
    seen = observations(trajectory, codec)
    assert "not valid JSON" in seen[0]
    assert "unknown tool 'Compile'" in seen[1] and "Bash" in seen[1]
    assert "content: Field required" in seen[2]
    assert "ended inside a <tool_call> block" in seen[3]
    # The truncated reply did not end on <|im_end|>, so the observation closes the turn itself.
    assert seen[3].startswith("<|im_end|>")
    assert "still-alive" in seen[4]


def test_turn_and_context_limits_end_the_episode_and_still_judge(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    forever = ReplayBackend([call("Bash", command="echo again")], tokenizer)
    limited = run_episode(sandbox_server, forever, codec, AgentConfig(max_turns=3))
    assert limited.end == "max_turns" and len(limited.turns) == 3 and limited.verdict is not None

    room = limited.prompt_length + 60  # room for one reply and one observation, not two
    squeezed = run_episode(sandbox_server, forever, codec, AgentConfig(max_context_tokens=room))
    assert squeezed.end == "max_context" and len(squeezed.token_ids) <= room
    assert squeezed.verdict is not None


def test_sandbox_timeouts_are_observations(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    replies = [
        call("Bash", command="sleep 5; echo never", timeout=300),  # the sandbox's own timeout (ms)
        call("Bash", command="sleep 4; echo late", timeout=20_000),  # the loop's client-side bound
        "Stop.",
    ]
    trajectory = run_episode(
        sandbox_server, ReplayBackend(replies, tokenizer), codec, AgentConfig(tool_timeout_s=1.5)
    )
    assert trajectory.end == "finished" and [t.tool_errors for t in trajectory.turns] == [1, 1, 0]
    seen = observations(trajectory, codec)
    assert "never" not in seen[0] and "time" in seen[0].lower()
    assert "did not finish within 2 s" in seen[1] or "did not finish within 1 s" in seen[1]


def test_wall_clock_budget(sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any) -> None:
    slow = ReplayBackend([call("Bash", command="true")], tokenizer, delay_s=0.6)
    trajectory = run_episode(sandbox_server, slow, codec, AgentConfig(wall_clock_s=1.0))
    assert trajectory.end == "wall_clock" and trajectory.verdict is not None


def test_a_sandbox_that_dies_mid_episode_is_retried_elsewhere_or_marked(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any, tmp_path: Path
) -> None:
    doomed = start_sandbox()
    try:

        async def kill_on_second_turn(turn: int) -> None:
            if turn == 1:
                doomed.stop()

        replies = [call("Bash", command="echo one"), call("Bash", command="echo two"), "Done."]
        backend = ReplayBackend(replies, tokenizer, before_turn=kill_on_second_turn)
        retried = run_episode([doomed, sandbox_server], backend, codec, AgentConfig())
        assert retried.end == "finished" and retried.attempts == 2 and retried.error is None
        assert len(retried.turns) == 3  # the second attempt started over in a new session

        writer = TrajectoryWriter(str(tmp_path / "records"))
        marked = run_episode(doomed, ReplayBackend(replies, tokenizer), codec, AgentConfig(), writer=writer)
        assert marked.end == "sandbox_error" and marked.attempts == 2 and marked.reward == -1
        assert marked.error is not None and "unreachable" in marked.error
        assert [t.end for t in read_trajectories(str(tmp_path / "records"))] == ["sandbox_error"]
    finally:
        cleanup(doomed)


def test_spans_nest_episode_turn_generate_tool_judge(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    exporter = InMemorySpanExporter()
    configure_tracing(processors=[SimpleSpanProcessor(exporter)], set_global=False)
    replies = [call("Bash", command="echo traced"), "Done."]
    trajectory = run_episode(sandbox_server, ReplayBackend(replies, tokenizer), codec, AgentConfig())
    spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
    by_name: dict[str, list[Any]] = {}
    for s in spans.values():
        by_name.setdefault(s.name, []).append(s)
    (episode,) = by_name["episode"]
    assert episode.attributes["cuda_agent.episode_id"] == trajectory.episode_id
    for name in ("turn", "generate", "tool_call", "judge"):
        assert all(s.attributes["cuda_agent.episode_id"] == trajectory.episode_id for s in by_name[name])
    (tool,) = by_name["tool_call"]
    assert spans[tool.parent.span_id].name == "turn"
    assert all(spans[g.parent.span_id].name == "turn" for g in by_name["generate"])
    (judge,) = by_name["judge"]
    assert judge.parent.span_id == episode.context.span_id


def test_each_episode_is_a_trace_of_its_own_linked_to_the_step(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    """Two episodes under one trainer step: each is the root of its own trace with an OpenTelemetry
    Link to the step span, its turns and judge stay in its trace, its record names that trace, and the
    step span (as the trainer's driver does it) links back to both. Generation spans carry the GenAI
    conventions' token counts."""
    from opentelemetry import trace

    from cuda_agent.telemetry import Stage, span
    from cuda_agent.trainer.driver import _link_episodes

    exporter = InMemorySpanExporter()
    configure_tracing(processors=[SimpleSpanProcessor(exporter)], set_global=False)

    async def main() -> list[Trajectory]:
        async with SandboxClient(sandbox_server.url) as client:
            with span(Stage.RUN, run="tr-links"), span(Stage.STEP, stage="ppo", step=1) as step:
                done = []
                for episode_id in ("ep-a", "ep-b"):
                    backend = ReplayBackend([call("Bash", command="echo traced"), "Done."], tokenizer)
                    done.append(
                        await AgentLoop(backend, client, codec, AgentConfig()).run(
                            TASK, SamplingParams(max_tokens=256), episode_id
                        )
                    )
                _link_episodes(step, done)
                return done

    trajectories = asyncio.run(main())
    finished = exporter.get_finished_spans()
    (run,) = [s for s in finished if s.name == Stage.RUN]
    (step,) = [s for s in finished if s.name == Stage.STEP]
    episodes = {s.attributes["cuda_agent.episode_id"]: s for s in finished if s.name == Stage.EPISODE}
    assert set(episodes) == {"ep-a", "ep-b"}
    trace_ids = {s.context.trace_id for s in episodes.values()}
    assert len(trace_ids) == 2 and run.context.trace_id not in trace_ids, "one trace per episode"
    for trajectory in trajectories:
        episode = episodes[trajectory.episode_id]
        assert episode.parent is None, "the episode is its trace's root"
        assert [link.context.span_id for link in episode.links] == [step.context.span_id]
        assert episode.links[0].context.trace_id == run.context.trace_id
        assert trajectory.trace_id == trace.format_trace_id(episode.context.trace_id)
        assert trajectory.span_id == trace.format_span_id(episode.context.span_id)
        inside = [s for s in finished if s.context.trace_id == episode.context.trace_id]
        assert {s.name for s in inside} >= {"episode", "turn", "generate", "tool_call", "judge"}
        # The sandbox requests are the aiohttp instrumentation's CLIENT spans, with url.* / http.*.
        requests = [s for s in inside if s.kind == trace.SpanKind.CLIENT]
        assert requests
        assert all(str(s.attributes["url.full"]).startswith(sandbox_server.url) for s in requests)
        assert all(s.attributes["http.response.status_code"] < 400 for s in requests)
        ours = [s for s in inside if s.kind != trace.SpanKind.CLIENT]
        assert all(s.attributes.get("cuda_agent.episode_id") == trajectory.episode_id for s in ours)
    # The step's side: a Link to each episode's root span and every episode's trace id.
    assert {(link.context.trace_id, link.context.span_id) for link in step.links} == {
        (s.context.trace_id, s.context.span_id) for s in episodes.values()
    }
    assert set(step.attributes["cuda_agent.episode_trace_ids"]) == {t.trace_id for t in trajectories}
    for generate in (s for s in finished if s.name == Stage.GENERATE):
        assert generate.attributes["gen_ai.operation.name"] == "text_completion"
        assert (
            generate.attributes["gen_ai.usage.input_tokens"]
            == generate.attributes["cuda_agent.prompt_tokens"]
        )
        assert (
            generate.attributes["gen_ai.usage.output_tokens"]
            == generate.attributes["cuda_agent.generated_tokens"]
        )
        assert generate.attributes["gen_ai.usage.output_tokens"] > 0


def test_chat_api_backend_runs_the_same_loop_marked_not_token_exact(
    sandbox_server: RunningServer, codec: ChatCodec
) -> None:
    """A hosted chat-only model: OpenAI chat completions with `tools` and `tool_calls`. The endpoint is a
    stand-in written for this test (no hosted API is reachable here) that replies from a script and
    keeps the requests; the backend and the loop are the production ones."""
    from aiohttp import web

    from cuda_agent.rollout.openai_http import OpenAIChatBackend

    script = [
        {"content": "", "tool_calls": [_chat_call("c1", "Bash", {"command": "echo via-chat-api"})]},
        {"content": "", "tool_calls": [_chat_call("c2", "Nope", {}), _chat_call("c3", "Glob", "{bad")]},
        {"content": "All done.", "tool_calls": None},
    ]
    requests: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        message = {"role": "assistant", **script[len(requests) - 1]}
        finish = "tool_calls" if message["tool_calls"] else "stop"
        return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": finish}]})

    async def main() -> Trajectory:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        backend = OpenAIChatBackend(f"http://127.0.0.1:{port}", "hosted-model")
        try:
            async with SandboxClient(sandbox_server.url) as sandbox:
                loop = AgentLoop(backend, sandbox, codec, AgentConfig())
                return await loop.run(TASK, SamplingParams(temperature=0.2, max_tokens=300))
        finally:
            await backend.close()
            await runner.cleanup()

    trajectory = asyncio.run(main())
    assert trajectory.end == "finished" and not trajectory.token_exact
    assert [t.tool_calls for t in trajectory.turns] == [["Bash"], ["Nope", "Glob"], []]
    assert trajectory.invalid_tool_call_kinds == {"unknown_tool": 1, "malformed": 1}
    first, second, third = requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in first["tools"]} >= {"Bash", "Write", "TodoWrite"}
    assert second["messages"][-2]["tool_calls"][0]["id"] == "c1"
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": second["messages"][-1]["content"],
    }
    assert "via-chat-api" in second["messages"][-1]["content"]
    assert [m.get("tool_call_id") for m in third["messages"][-2:]] == ["c2", "c3"]
    assert "unknown tool 'Nope'" in third["messages"][-2]["content"]
    # The record is the chat template's rendering of the same conversation (policy tokens masked 1).
    replies = [codec.decode(ids) for mask, ids in segments(trajectory) if mask == 1]
    assert '"name": "Bash"' in replies[0] and replies[-1] == "All done.<|im_end|>"


def _chat_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}


def test_more_concurrent_episodes_than_session_slots_queue_for_a_slot(
    sandbox_server: RunningServer, codec: ChatCodec, tokenizer: Any
) -> None:
    """The fixture's server has 8 session slots; 16 episodes run at once through one loop and one
    client. Those that find the server full (503) wait for a slot instead of failing."""
    replies = [call("Bash", command="echo busy; sleep 0.5"), "Done."]
    backend = ReplayBackend(replies, tokenizer)

    async def main() -> list[Trajectory]:
        async with SandboxClient(sandbox_server.url) as sandbox:
            loop = AgentLoop(backend, sandbox, codec, AgentConfig())
            return list(await asyncio.gather(*(loop.run(TASK, SamplingParams()) for _ in range(16))))

    trajectories = asyncio.run(main())
    assert [t.end for t in trajectories] == ["finished"] * 16
    assert all(t.attempts == 1 and len(t.turns) == 2 for t in trajectories)
    assert len({t.episode_id for t in trajectories}) == 16
