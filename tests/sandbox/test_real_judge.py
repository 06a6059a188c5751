"""The server with the real judge CLI on CPU: an agent session builds, verifies and profiles an example
solution through `verify` on its PATH, and the reward service judges the same candidate statelessly.
Each judge run compiles a C++ extension (about half a minute on two cores), hence `slow`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import REAL_JUDGE_DIR, RunningServer, cleanup, needs_root, start_server

from cuda_agent.sandbox.server.models import EvaluateRequest, JudgeOptions, TaskRef

pytestmark = [needs_root(), pytest.mark.slow]
EXAMPLES = Path(__file__).parents[2] / "examples"
TASK = (EXAMPLES / "tasks" / "relu_mul_add.py").read_text()
SOLUTION = (EXAMPLES / "solutions" / "relu_mul_add" / "cpu" / "model_new.py").read_text()
QUICK = JudgeOptions(trials=2, profile_trials=5, compile_mode="none")


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(
        "--shared-judge-cache=true",
        judge_dir=REAL_JUDGE_DIR,
        judge_command=[sys.executable, "-m", "cuda_agent.sandbox.judge.cli"],
    )
    try:
        yield running
    finally:
        cleanup(running)


def test_agent_session_verifies_and_profiles_with_the_real_judge(server: RunningServer) -> None:
    sid = server.client.create_session(TASK, name="relu_mul_add", judge=QUICK).session_id
    server.client.tool(sid, "write", {"file_path": "model_new.py", "content": SOLUTION})
    verify = server.client.tool(sid, "bash", {"command": "verify; echo rc=$?", "timeout": 600_000})
    assert "compiled: yes" in verify.output and "correct: yes" in verify.output and "rc=0" in verify.output
    run = server.client.judge(sid, "profile")
    assert run.result is not None and run.result.reward >= 1 and run.result.correct
    assert run.result.build_cached  # the session's build cache kept the extension from `verify`
    # The machine's judge seed (sandbox_helpers.judge_seed) spared the judges the torch header build.
    assert "for this flag set: from the judge seed" in (run.result.build_log or "")
    isolation = (run.result.model_extra or {}).get("isolation", {})
    assert str(isolation.get("landlock", "")).startswith("on")  # the judge's own confinement still works
    status = server.client.status()
    assert status.judge_zygote and status.judge_zygote_preload == "full"  # forked, inductor pre-imported

    # A second session (another slot, so another judge uid) reuses what the first one's judge wrote to
    # the shared cache: its entries must be open to the judges' group, not to their writer alone.
    other = server.client.create_session(TASK, name="relu_mul_add", judge=QUICK).session_id
    server.client.tool(other, "write", {"file_path": "model_new.py", "content": SOLUTION})
    second = server.client.judge(other, "verify")
    assert second.result is not None and second.result.correct, second.error or second.result
    assert second.result.build_cached


def test_reward_service_judges_a_wrong_candidate_as_minus_one(server: RunningServer) -> None:
    """With the torch.compile baseline on: it is compiled before the candidate loads, by a worker whose
    uid has no passwd entry (inductor's getpass.getuser() once failed there, silently dropping it)."""
    wrong = SOLUTION.replace("+ pc[i]", "- pc[i]")
    assert wrong != SOLUTION
    with_compile = QUICK.model_copy(update={"compile_mode": "default"})
    request = EvaluateRequest(task=TaskRef(source=TASK), model_new=wrong, judge=with_compile)
    result = server.client.evaluate(request)
    assert result.reward == -1 and result.compiled and not result.correct
    assert result.error is not None and result.error.startswith("wrong result")
    notes = (result.model_extra or {}).get("notes", [])
    assert any("torch.compile baseline (default) compiled" in n for n in notes), notes

    # Another slot's judge compiles the same baseline from the shared cache the first one wrote.
    right = EvaluateRequest(task=TaskRef(source=TASK), model_new=SOLUTION, judge=with_compile)
    again = server.client.evaluate(right)
    assert again.reward >= 1 and again.correct, again.error
    notes = (again.model_extra or {}).get("notes", [])
    assert any("compiled before candidate code" in n and "(shared judge cache)" in n for n in notes), notes


def test_the_options_of_an_evaluate_request_are_what_the_judge_ran_with(server: RunningServer) -> None:
    """Options set through the server are checked where they arrive: in the real judge's verdict, which
    reports the precision, verify trials and timed trials it used, and the baseline it skipped."""
    options = JudgeOptions(trials=3, profile_trials=6, compile_mode="none", precision="tf32")
    request = EvaluateRequest(task=TaskRef(source=TASK), model_new=SOLUTION, judge=options)
    result = server.client.evaluate(request)
    assert result.reward >= 1 and result.correct, result.error
    extra = result.model_extra or {}
    assert (result.precision, extra.get("trials"), extra.get("profile_trials")) == ("tf32", 3, 6)
    assert result.timings_ms.get("compile") is None and result.speedup.get("compile") is None
