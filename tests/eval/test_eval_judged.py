"""`cuda-agent eval` end to end with the real judge on CPU (no mocks): example solutions judged by local
judge processes give the expected table and a rerun resumes without judging again; an attack our judge
refuses but a plain allclose harness accepts is listed with the judge's reason; a replay policy runs
through the agent loop against a real sandbox server and its final judge call is the row.

Cost is kept low on purpose: the two example solutions are the CPU ones tests/judge/test_solutions.py
builds into the same judge build cache (CUDA_AGENT_JUDGE_CACHE or ~/.cache/cuda-agent/judge-build), so
they are judged from cache; the attack and the policy's candidate are refused by the static screen before
any build; and no torch.compile baseline is timed (--compile-mode none: rewards are then at most 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))

import sandbox_helpers
from sandbox_helpers import REAL_JUDGE_DIR, RunningServer, cleanup

from cuda_agent.eval import cli, metrics
from cuda_agent.eval.models import EvalReport, TaskResult
from cuda_agent.eval.runner import ResultLog

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
SOLUTIONS = REPO / "examples" / "solutions"
INHERITS_MODEL = REPO / "tests" / "judge" / "attacks" / "inherits_model" / "model_new.py"
QUICK = ["--compile-mode", "none", "--trials", "2", "--profile-trials", "5", "--no-progress"]


@pytest.fixture(autouse=True)
def small_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_AGENT_TASK_SCALE", "small")


def _load(out: Path) -> tuple[EvalReport, dict[str, TaskResult]]:
    report = EvalReport.model_validate_json((out / "report.json").read_text())
    return report, ResultLog(out / "results.jsonl").rows


def test_example_solutions_table_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--solutions", str(SOLUTIONS), "--tasks", str(TASKS), "--only", "relu_mul_add,row_sum"]
    args += ["--out", str(out), "--jobs", "2", *QUICK]
    assert cli.main(args) == 0
    report, rows = _load(out)
    assert set(rows) == {"tasks/relu_mul_add", "tasks/row_sum"}
    for row in rows.values():
        assert (row.status, row.compiled, row.correct, row.violations) == ("judged", True, True, []), row
        assert row.candidate == f"{row.task}/cpu" and (row.device, row.precision) == ("cpu", "strict-fp32")
        assert row.speedup_eager is not None and row.speedup_compile is None
        # The judge's milestone rule without a compile baseline: 2 when > 5 % faster than eager, else 1.
        assert row.reward == (2 if row.speedup_eager > 1.05 else 1)
    overall = report.overall
    assert (overall.candidates, overall.judged, overall.correct, overall.pass_rate) == (2, 2, 2, 1.0)
    assert overall.faster_than_compile is None and overall.geomean_speedup_compile is None
    speedups = [r.speedup_eager for r in rows.values() if r.speedup_eager]
    assert overall.geomean_speedup_eager == pytest.approx(metrics.geomean(speedups))
    assert [s.level for s in report.levels] == ["tasks"] and report.evaluations == 2
    assert (report.device, report.precision, report.compile_mode) == ("cpu", "strict-fp32", "none")
    assert report.evaluations_per_gpu_hour is not None and report.gpus is None
    markdown = (out / "report.md").read_text()
    assert "| tasks | 2 | 2 | 100.0% |" in markdown and "| tasks/row_sum | " in markdown
    assert (out / "levels.png").exists() and (out / "speedups.png").exists()

    results = (out / "results.jsonl").read_text()
    assert cli.main(args) == 0  # resumed: every key is done, nothing is judged again
    again, _ = _load(out)
    assert again.evaluations == 0 and again.overall == report.overall
    assert (out / "results.jsonl").read_text() == results
    assert cli.main([*args, "--precision", "tf32"]) == 2  # another run's settings never mix in


def _eval_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cuda-agent eval` as a user runs it: its own process, in `cwd`."""
    command = [sys.executable, "-m", "cuda_agent.cli", "eval", *args, *QUICK]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)


def test_relative_paths_from_another_directory_and_nothing_judged(tmp_path: Path) -> None:
    """Relative --tasks / --solutions / --out from a working directory that is none of them: the judges run
    in --out, so a path left relative pointed nowhere and every row was a task error, exit 0. Every path
    is now absolute before anything runs; and a run where no row could be judged exits 1 with one line."""
    data, cwd = tmp_path / "data", tmp_path / "cwd"
    (data / "tasks").mkdir(parents=True)
    (data / "tasks" / "relu_mul_add.py").write_text((TASKS / "relu_mul_add.py").read_text())
    (data / "solutions" / "relu_mul_add").mkdir(parents=True)
    model_new = (SOLUTIONS / "relu_mul_add" / "cpu" / "model_new.py").read_text()
    (data / "solutions" / "relu_mul_add" / "model_new.py").write_text(model_new)
    cwd.mkdir()
    done = _eval_in(cwd, "--solutions", "../data/solutions", "--tasks", "../data/tasks", "--out", "out")
    assert done.returncode == 0, done.stderr[-2000:]
    report, rows = _load(cwd / "out")
    row = rows["tasks/relu_mul_add"]
    assert (row.status, row.compiled, row.correct, row.error) == ("judged", True, True, None), row
    assert row.reward >= 1 and report.overall.judged == 1
    assert json.loads((cwd / "out" / "run.json").read_text())["solutions"] == str(data / "solutions")

    (data / "empty").mkdir()
    nothing = _eval_in(
        cwd, "--solutions", "../data/empty", "--tasks", "../data/tasks", "--out", "none", "--json"
    )
    assert nothing.returncode == 1, nothing.stderr[-2000:]
    lines = [line for line in nothing.stderr.splitlines() if line.startswith("cuda-agent eval:")]
    assert lines == [
        "cuda-agent eval: no row could be judged (0 of 1 rows have a verdict); "
        f"the reasons are in {cwd / 'none' / 'report.md'}"
    ]
    assert "no-candidate: no candidate under" in (cwd / "none" / "report.md").read_text()
    # --json: stdout is the report alone, the same as report.json
    assert EvalReport.model_validate_json(nothing.stdout) == _load(cwd / "none")[0]


def test_refused_by_the_judge_but_accepted_by_allclose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solutions = tmp_path / "solutions" / "relu_mul_add"
    solutions.mkdir(parents=True)
    (solutions / "model_new.py").write_text(INHERITS_MODEL.read_text())
    out = tmp_path / "out"
    args = [
        "--solutions",
        str(tmp_path / "solutions"),
        "--tasks",
        str(TASKS),
        "--only",
        "relu_mul_add,row_sum",
    ]
    assert cli.main([*args, "--out", str(out), "--compare-allclose", *QUICK]) == 0
    report, rows = _load(out)
    refused = rows["tasks/relu_mul_add"]
    assert refused.reward == -1 and refused.violations[0].startswith("static.inherits-model")
    assert refused.allclose is not None and refused.allclose.accepted and refused.allclose.max_abs_err == 0.0
    assert rows["tasks/row_sum"].status == "no-candidate" and report.overall.candidates == 2
    assert [(f.key, f.reason.split(":")[0]) for f in report.refused_allclose_accepts] == [
        ("tasks/relu_mul_add", "static.inherits-model")
    ]
    assert "tasks/relu_mul_add: static.inherits-model" in capsys.readouterr().out
    assert "| tasks/relu_mul_add | static.inherits-model" in (out / "report.md").read_text()


@pytest.fixture(scope="module")
def judge_server() -> Iterator[RunningServer]:
    """A sandbox server running the real judge, exec'd per run (no zygote start-up to wait for), with one
    build cache for every run, so the torch headers are precompiled once for the module, not per session."""
    sandbox_helpers._next_uid_base[0] = 170_000 + 2000 * (os.getpid() % 16)
    command = [sys.executable, "-m", "cuda_agent.sandbox.judge.cli"]
    for _ in range(5):
        try:
            running = sandbox_helpers.start_server(
                "--shared-judge-cache", "true", judge_dir=REAL_JUDGE_DIR, judge_command=command
            )
            break
        except RuntimeError as exc:
            if "uses this uid range" not in str(exc):
                raise
    else:
        raise RuntimeError("no free uid range for a sandbox server")
    try:
        yield running
    finally:
        cleanup(running)


@pytest.mark.skipif(os.geteuid() != 0, reason="root-mode isolation needs uid 0")
def test_replay_policy_over_one_task(tmp_path: Path, judge_server: RunningServer) -> None:
    write = {
        "name": "Write",
        "arguments": {"file_path": "model_new.py", "content": INHERITS_MODEL.read_text()},
    }
    replies = ["I will write ModelNew.\n<tool_call>\n" + json.dumps(write) + "\n</tool_call>", "Done."]
    script = tmp_path / "replies.json"
    script.write_text(json.dumps({"relu_mul_add": replies}))
    out = tmp_path / "out"
    args = ["--policy", f"replay:{script}", "--tokenizer", str(REPO / "examples" / "models" / "tiny-smollm2")]
    args += [
        "--tasks",
        str(TASKS),
        "--only",
        "relu_mul_add",
        "--sandbox",
        judge_server.url,
        "--out",
        str(out),
    ]
    assert cli.main([*args, *QUICK]) == 0
    report, rows = _load(out)
    row = rows["tasks/relu_mul_add"]
    assert (row.status, row.episode_end, row.turns, row.reward) == ("judged", "finished", 2, -1), row
    assert (
        row.violations[0].startswith("static.inherits-model") and row.candidate == "eval-tasks_relu_mul_add"
    )
    assert report.mode == "policy" and report.overall.candidates == 1 and report.overall.correct == 0
    records = [json.loads(line) for part in (out / "trajectories").glob("*.jsonl") for line in part.open()]
    assert [r["episode_id"] for r in records] == ["eval-tasks_relu_mul_add"]
    assert records[0]["verdict"]["violations"] == row.violations


@pytest.mark.skipif(os.geteuid() != 0, reason="root-mode isolation needs uid 0")
def test_solutions_through_the_sandbox_reward_service(tmp_path: Path, judge_server: RunningServer) -> None:
    """`--sandbox URL`: /v1/evaluate judges each candidate, a task that itself fails is a task error, and
    the allclose comparison runs in a sandbox session (confined)."""
    tasks, solutions = tmp_path / "tasks", tmp_path / "solutions"
    tasks.mkdir()
    (tasks / "relu_mul_add.py").write_text((TASKS / "relu_mul_add.py").read_text())
    (tasks / "broken.py").write_text((TASKS / "relu_mul_add.py").read_text() + "\nraise RuntimeError('no')\n")
    for name in ("relu_mul_add", "broken"):
        (solutions / name).mkdir(parents=True)
        (solutions / name / "model_new.py").write_text(INHERITS_MODEL.read_text())
    out = tmp_path / "out"
    args = ["--solutions", str(solutions), "--tasks", str(tasks), "--sandbox", judge_server.url]
    assert cli.main([*args, "--out", str(out), "--compare-allclose", *QUICK]) == 0
    report, rows = _load(out)
    refused = rows["tasks/relu_mul_add"]
    assert refused.violations[0].startswith("static.inherits-model")
    # The plain harness ran confined, as an agent command in a session of the same server.
    assert refused.allclose is not None and refused.allclose.accepted and refused.allclose.confined
    assert [f.key for f in report.refused_allclose_accepts] == [
        "tasks/relu_mul_add"
    ] and report.allclose_confined
    assert rows["tasks/broken"].status == "task-error" and "422" in (rows["tasks/broken"].error or "")
    assert report.task_errors and report.task_errors[0].startswith("tasks/broken: ")
    assert report.overall.candidates == 2 and report.overall.judged == 1
