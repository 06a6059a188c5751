"""One end-to-end judged episode on CPU: a scripted policy replays a recorded correct trajectory (it
writes the example solution through a Write tool call, then stops), the loop makes the final judge
call through a sandbox server running the real judge, and the episode's reward is the judge's. The
judge builds a C++ extension (10-90 s cold), hence one episode and `slow`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from agent_helpers import EXAMPLES, start_sandbox
from sandbox_helpers import REAL_JUDGE_DIR, RunningServer, cleanup, needs_root

from cuda_agent.agent import AgentConfig, AgentLoop, ChatCodec, Trajectory, openai_tools
from cuda_agent.api.judge import JudgeOptions
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.client import SandboxClient

pytestmark = [needs_root(), pytest.mark.slow]
TASK = TaskRef(source=(EXAMPLES / "tasks" / "relu_mul_add.py").read_text(), name="relu_mul_add")
SOLUTION = (EXAMPLES / "solutions" / "relu_mul_add" / "cpu" / "model_new.py").read_text()
QUICK = JudgeOptions(trials=2, profile_trials=5, compile_mode="none")


@pytest.fixture(scope="module")
def real_judge_server() -> Iterator[RunningServer]:
    running = start_sandbox(
        judge_dir=REAL_JUDGE_DIR, judge_command=[sys.executable, "-m", "cuda_agent.sandbox.judge.cli"]
    )
    try:
        yield running
    finally:
        cleanup(running)


def test_replayed_correct_trajectory_earns_the_judges_reward(
    real_judge_server: RunningServer, tokenizer: Any
) -> None:
    write = {"name": "Write", "arguments": {"file_path": "model_new.py", "content": SOLUTION}}
    replies = [
        "I will write a fused C++ kernel.\n<tool_call>\n" + json.dumps(write) + "\n</tool_call>",
        "model_new.py is written; I am done.",
    ]
    config = AgentConfig(judge=QUICK)
    codec = ChatCodec(tokenizer, openai_tools(config.tools))

    async def main() -> Trajectory:
        async with SandboxClient(real_judge_server.url) as sandbox:
            loop = AgentLoop(ReplayBackend(replies, tokenizer), sandbox, codec, config)
            return await loop.run(TASK, SamplingParams())

    trajectory = asyncio.run(main())
    assert trajectory.end == "finished" and [t.tool_calls for t in trajectory.turns] == [["Write"], []]
    assert trajectory.turns[0].tool_errors == 0
    assert trajectory.verdict is not None and trajectory.verdict.correct, trajectory.verdict
    assert trajectory.reward >= 1 and trajectory.reward == trajectory.verdict.reward
    assert "compiled: yes" in trajectory.verdict.summary
