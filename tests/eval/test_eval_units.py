"""The evaluation's pure parts on synthetic data: metrics (fast_p, geometric means, rates), the report
(JSON model, Markdown, plots), task and candidate discovery in every supported layout, the result log's
resume rules, policy specs and the CLI's argument errors. No judge runs here (test_eval_judged.py does)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.eval import cli, metrics
from cuda_agent.eval.models import AllcloseCheck, EvalConfig, JudgeSettings, TaskResult
from cuda_agent.eval.policy import PolicySpec, replay_script
from cuda_agent.eval.report import build_report, level_table, plot, to_markdown
from cuda_agent.eval.runner import ResultLog, check_run_file
from cuda_agent.eval.tasks import find_candidates, load_tasks

REPO = Path(__file__).resolve().parents[2]
TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def row(
    key: str, reward: int, eager: float | None = None, compile_: float | None = None, **kw: object
) -> TaskResult:
    level, task = key.split("/")[:2]
    fields: dict[str, Any] = {"compiled": reward > 0, "correct": reward > 0, **kw}
    fields |= {"key": key, "level": level, "task": task, "reward": reward}
    return TaskResult.model_validate({**fields, "speedup_eager": eager, "speedup_compile": compile_})


def test_geomean() -> None:
    assert metrics.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert metrics.geomean([]) is None
    with pytest.raises(ValueError, match="non-positive"):
        metrics.geomean([1.0, 0.0])
    with pytest.raises(ValueError):
        metrics.geomean([math.inf])


def test_fast_p_counts_every_outcome_in_the_denominator() -> None:
    outcomes = [(True, 2.0), (True, 0.5), (False, 3.0), (True, None)]
    assert metrics.fast_p(outcomes, 1.0) == pytest.approx(0.25)  # the wrong 3x and the untimed do not count
    assert metrics.fast_p(outcomes, 0.0) == pytest.approx(0.5)
    assert metrics.fast_p([], 1.0) == 0.0
    assert metrics.p_label(1.0) == "fast_1" and metrics.p_label(1.5) == "fast_1.5"


def test_summary_of_a_level() -> None:
    rows = [
        row("l1/a", 3, 2.0, 1.5),
        row("l1/b", 2, 1.5, 0.9),
        row("l1/c", 1, 1.02, 0.5),
        row("l1/d", -1, violations=["torch-compute: aten::relu"], compiled=True),
        row("l1/e", -1, status="no-candidate"),
    ]
    s = metrics.summarise("l1", rows, [0.0, 1.0], margin=0.05)
    assert (s.candidates, s.judged, s.correct) == (5, 4, 3)
    assert s.pass_rate == pytest.approx(0.6)
    assert s.faster_than_eager == pytest.approx(0.4)  # 1.02x is inside the 5 % margin
    assert s.faster_than_compile == pytest.approx(0.2)
    assert s.geomean_speedup_eager == pytest.approx((2.0 * 1.5 * 1.02) ** (1 / 3))
    assert s.geomean_speedup_compile == pytest.approx((1.5 * 0.9 * 0.5) ** (1 / 3))
    assert s.fast_p_eager == {"fast_0": pytest.approx(0.6), "fast_1": pytest.approx(0.6)}
    assert s.fast_p_compile["fast_1"] == pytest.approx(0.2)
    assert s.rewards == {"-1": 2, "1": 1, "2": 1, "3": 1}
    assert s.mean_reward == pytest.approx(0.8)


def test_compile_rates_are_unknown_without_a_compile_baseline() -> None:
    s = metrics.summarise("x", [row("x/a", 2, 1.5)], [1.0], margin=0.05)
    assert s.faster_than_compile is None and s.fast_p_compile == {} and s.geomean_speedup_compile is None


def test_review_lists() -> None:
    rows = [
        row("l/fast", 3, 40.0, 12.0),
        row("l/ok", 3, 3.0, 2.0),
        row("l/wrong_fast", -1, 50.0, compiled=True, error="wrong result"),
        row(
            "l/refused",
            -1,
            violations=["static.inherits-model: x"],
            allclose=AllcloseCheck(accepted=True, max_abs_err=0.0),
        ),
        row("l/build", -1, error="build failed", allclose=AllcloseCheck(accepted=True)),
        row(
            "l/rejected", -1, violations=["precision"], compiled=True, allclose=AllcloseCheck(accepted=False)
        ),
    ]
    assert [f.key for f in metrics.suspicious(rows, 10.0)] == ["l/fast"]
    flagged = metrics.refused_allclose_accepts(rows)
    assert [(f.key, f.reason) for f in flagged] == [("l/refused", "static.inherits-model: x")]


def test_report_files(tmp_path: Path) -> None:
    rows = [row("level1/a", 3, 2.0, 1.2), row("level1/b", -1, violations=["caching"], compiled=True),
            row("level2/c", 2, 30.0, 0.8)]  # fmt: skip
    cfg = EvalConfig(tasks="t", out_dir=tmp_path, solutions=tmp_path, device="cuda", fast_p=[0.0, 1.0])
    report = build_report(cfg, rows, evaluated=3, wall_s=36.0, gpus=2)
    assert [s.level for s in report.levels] == ["level1", "level2"]
    assert report.overall.candidates == 3 and report.overall.correct == 2
    assert report.evaluations_per_gpu_hour == pytest.approx(150.0)  # 3 evaluations / (0.01 h x 2 GPUs)
    assert [f.key for f in report.suspicious] == ["level2/c"]
    markdown = to_markdown(report, rows)
    expected = [
        "## Per level",
        "| level1 | 2 | 1 | 50.0% |",
        "| level2/c | 2 | True | 30.00x | 0.80x |",
        "| level1/b | -1 | False | - | - | caching |",
        "level2/c: speedup 30.0x > 10x",
        "150 per GPU-hour",
    ]
    for text in expected:
        assert text in markdown, text
    assert "| **overall** | 3 | 2 |" in level_table(report)
    written = plot(report, rows, tmp_path)
    assert [p.name for p in written] == ["levels.png", "speedups.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert json.loads(report.model_dump_json())["overall"]["fast_p_eager"] == {
        "fast_0": 2 / 3,
        "fast_1": 2 / 3,
    }


def _write(path: Path, text: str = TASK) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_kernelbench_layout_and_generated_samples(tmp_path: Path) -> None:
    bench = tmp_path / "KernelBench"
    for name in (
        "level1/1_Square_matmul.py",
        "level1/2_Relu.py",
        "level1/10_Gelu.py",
        "level2/1_Conv_Relu.py",
    ):
        _write(bench / name)
    runs = tmp_path / "runs" / "my_run"
    for level, problem, sample in ((1, 1, 0), (1, 1, 1), (2, 1, 0), (1, 10, 0)):
        _write(runs / f"level_{level}_problem_{problem}_sample_{sample}_kernel.py", "class ModelNew: pass\n")
    tasks = load_tasks(str(bench))
    assert [t.key for t in tasks] == [
        "level1/10_Gelu",
        "level1/1_Square_matmul",
        "level1/2_Relu",
        "level2/1_Conv_Relu",
    ]
    candidates, missing = find_candidates(tasks, tmp_path / "runs", "cuda")
    assert sorted(c.key for c in candidates) == [
        "level1/10_Gelu",
        "level1/1_Square_matmul/sample_0",
        "level1/1_Square_matmul/sample_1",
        "level2/1_Conv_Relu",
    ]
    assert [t.key for t in missing] == ["level1/2_Relu"]
    assert load_tasks(str(bench), levels=["level2"])[0].name == "1_Conv_Relu"
    assert [t.name for t in load_tasks(str(bench), only=["2_Relu"])] == ["2_Relu"]
    with pytest.raises(FileNotFoundError, match=r"no \*\.py task"):
        load_tasks(str(bench), levels=["level9"])


def test_examples_layout_picks_the_devices_variant() -> None:
    tasks = load_tasks(str(REPO / "examples" / "tasks"))
    assert len(tasks) == 12 and {t.level for t in tasks} == {"tasks"}
    for device in ("cpu", "cuda"):
        candidates, missing = find_candidates(tasks, REPO / "examples" / "solutions", device)
        assert not missing and len(candidates) == 12
        assert all(c.path.name in (device, f"{device}_ws") and c.label is None for c in candidates)
    layernorm = next(c for c in candidates if c.task.name == "layernorm")
    assert layernorm.is_workspace and "kernels/layernorm.cu" in layernorm.files()


def test_cuda_agent_workspace_and_single_files(tmp_path: Path) -> None:
    _write(tmp_path / "tasks" / "relu.py")
    _write(tmp_path / "tasks" / "gelu.py")
    _write(tmp_path / "tasks" / "tanh.py")
    ws = tmp_path / "sol" / "relu"
    for name in (
        "binding.cpp",
        "binding_registry.h",
        "kernels/relu.cu",
        "kernels/relu_binding.cpp",
        "model_new.py",
    ):
        _write(ws / name, "//\n")
    _write(tmp_path / "sol" / "gelu.py", "class ModelNew: pass\n")
    candidates, missing = find_candidates(load_tasks(str(tmp_path / "tasks")), tmp_path / "sol", "cuda")
    assert {c.key: c.is_workspace for c in candidates} == {"tasks/relu": True, "tasks/gelu": False}
    assert [t.name for t in missing] == ["tanh"]
    with pytest.raises(FileNotFoundError, match="--solutions"):
        find_candidates([], tmp_path / "nowhere", "cpu")


def test_result_log_resume_rules(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    log = ResultLog(path)
    log.append(row("l/a", 2, 1.5))
    log.append(row("l/b", -1, status="no-result", error="crash"))
    with path.open("a") as f:
        f.write('{"key": "l/c", "lev')  # a write cut by a kill
    again = ResultLog(path)
    assert again.done("l/a") and not again.done("l/b") and not again.done("l/c")
    again.append(row("l/b", 1, 1.0))
    assert ResultLog(path).rows["l/b"].reward == 1  # the last line of a key wins


def test_run_file_refuses_mixing_runs(tmp_path: Path) -> None:
    cfg = EvalConfig(tasks="t", out_dir=tmp_path, solutions=tmp_path)
    check_run_file(cfg)
    check_run_file(cfg)
    other = cfg.model_copy(update={"judge": JudgeSettings(precision="tf32")})
    with pytest.raises(ValueError, match="judge differ"):
        check_run_file(other)


def test_config_and_policy_specs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of solutions"):
        EvalConfig(tasks="t", out_dir=tmp_path)
    spec = PolicySpec.parse("openai:http://127.0.0.1:8000", model="m")
    assert (spec.kind, spec.target) == ("openai", "http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="unknown kind 'vllm'"):
        PolicySpec.parse("vllm:x")
    with pytest.raises(ValueError, match="--tokenizer"):
        _ = spec.tokenizer_dir
    assert PolicySpec.parse("hf:/models/p").tokenizer_dir == Path("/models/p")
    script = _write(tmp_path / "r.json", json.dumps({"relu": ["a", "b"]}))
    assert replay_script(script) == {"relu": ["a", "b"]}
    with pytest.raises(ValueError, match="expected a JSON list"):
        replay_script(_write(tmp_path / "bad.json", "[1, 2]"))


def test_cli_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--tasks", "x"])
    assert exc.value.code == 2 and "one of the arguments --solutions --policy" in capsys.readouterr().err
    code = cli.main(
        ["--solutions", str(tmp_path), "--tasks", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "--tasks" in capsys.readouterr().err
    code = cli.main(
        ["--solutions", str(tmp_path), "--tasks", "t", "--jobs", "0", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "invalid jobs" in capsys.readouterr().err
    out = str(tmp_path / "o")
    code = cli.main(
        ["--policy", "openai:http://127.0.0.1:9", "--tasks", str(REPO / "examples" / "tasks"), "--out", out]
    )
    assert code == 2 and "--tokenizer" in capsys.readouterr().err


def test_policy_backends_are_the_rollout_backends(tmp_path: Path) -> None:
    """hf: loads a transformers model (a tiny random-init one saved here) behind TransformersBackend with
    the tokenizer's chat template; openai-*: the HTTP backends, which need the served model's name."""
    import asyncio
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    from cuda_agent.eval.policy import PolicyBackends, load_codec
    from cuda_agent.eval.tasks import Task
    from cuda_agent.rollout.base import SamplingParams
    from cuda_agent.rollout.hf import TransformersBackend
    from cuda_agent.rollout.openai_http import OpenAIChatBackend, OpenAICompatibleBackend
    from cuda_agent.rollout.replay import ReplayBackend

    tiny = REPO / "examples" / "models" / "tiny-smollm2"
    model_dir = tmp_path / "policy"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny)).save_pretrained(model_dir)  # type: ignore[no-untyped-call]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, model_dir / name)
    spec = PolicySpec.parse(f"hf:{model_dir}")
    codec = load_codec(spec, ["bash", "write"])
    assert [t["function"]["name"] for t in codec.tools] == ["Bash", "Write"]
    backends = PolicyBackends(spec, codec, "cpu")
    task = Task(level="tasks", name="relu", source=TASK)
    backend = backends.for_task(task)
    assert isinstance(backend, TransformersBackend)
    generation = asyncio.run(backend.generate(codec.encode("hello"), SamplingParams(max_tokens=3, seed=0)))
    assert 1 <= len(generation.token_ids) <= 3
    backend.close()

    script = _write(tmp_path / "replies.json", json.dumps({"relu": ["done"]}))
    assert isinstance(
        PolicyBackends(PolicySpec.parse(f"replay:{script}"), codec, "cpu").for_task(task), ReplayBackend
    )
    chat = PolicyBackends(PolicySpec.parse("openai-chat:http://127.0.0.1:9", model="m"), codec, "cpu")
    assert isinstance(chat.for_task(task), OpenAIChatBackend)
    text = PolicyBackends(PolicySpec.parse("openai-text:http://127.0.0.1:9", model="m"), codec, "cpu")
    assert isinstance(text.shared, OpenAICompatibleBackend) and not text.shared.token_exact
    with pytest.raises(ValueError, match="--model"):
        PolicyBackends(PolicySpec.parse("openai:http://127.0.0.1:9"), codec, "cpu")


def test_path_arguments_are_made_absolute_at_the_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    args = argparse.Namespace(
        solutions=Path("sol"),
        out=Path("o"),
        run=None,
        tokenizer=Path("tok"),
        tasks="t",
        policy="replay:r.json",
    )
    cli.absolute_paths(args)
    assert (args.solutions, args.out, args.run) == (tmp_path / "sol", tmp_path / "o", None)
    assert (args.tokenizer, args.tasks, args.policy) == (
        tmp_path / "tok",
        str(tmp_path / "t"),
        f"replay:{tmp_path}/r.json",
    )
    for policy, expected in (
        ("hf:model", f"hf:{tmp_path}/model"),  # a local directory
        ("hf:HuggingFaceTB/SmolLM2-135M", "hf:HuggingFaceTB/SmolLM2-135M"),  # a hub id stays one
        ("openai:http://127.0.0.1:8000", "openai:http://127.0.0.1:8000"),
    ):
        args.policy = policy
        cli.absolute_paths(args)
        assert args.policy == expected
    args.tasks = "s3://bench/kernelbench/"
    cli.absolute_paths(args)
    assert args.tasks == "s3://bench/kernelbench/"


def test_local_judge_rows_say_where_the_time_went_and_who_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cuda-agent eval`'s local judge process (the real judge CLI) hands its evaluation to the service named
    by CUDA_AGENT_JUDGE_SERVICE, and the row records that and the judge's time breakdown (phases, steps,
    lock waits). The service here is a stand-in speaking the service protocol with a verdict written by the
    judge's own model: a real one starts a torch judge zygote (minutes on this 2-core machine; it is
    tests/judge/test_auto_service.py's; bench/eval_throughput_gpu.py runs eval through one on the H200)."""
    import asyncio
    import socket
    import threading

    from cuda_agent.api.judge import JudgeVerdict, PhaseSeconds
    from cuda_agent.eval.judging import LocalJudge, result_row
    from cuda_agent.eval.tasks import Candidate, Task
    from cuda_agent.sandbox.judge.local_service import NO_SERVICE_FLAG

    verdict = JudgeVerdict(
        reward=2,
        compiled=True,
        correct=True,
        device="cpu",
        seconds=PhaseSeconds(build=9.5, verify=3.0, profile=1.5),
        steps_s={"build": 9.5, "references": 0.7, "worker.compile_baseline": 6.25},
        lock_wait_s=4.0,
        build_lock_wait_s=0.25,
    )
    requests: list[dict[str, Any]] = []
    sock_path = tmp_path / "s" / "judge.sock"
    sock_path.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(1)

    def serve_one() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rwb") as stream:
            requests.append(json.loads(stream.readline()))
            for message in (
                {"accepted": True, "pid": 1},
                {"stdout": verdict.model_dump_json() + "\n", "exit": 0},
            ):
                stream.write(json.dumps(message).encode() + b"\n")
                stream.flush()

    server = threading.Thread(target=serve_one, daemon=True)
    server.start()
    monkeypatch.setenv("CUDA_AGENT_JUDGE_SERVICE", str(sock_path))
    task_path = _write(tmp_path / "relu.py")
    candidate = Candidate(
        Task(level="tasks", name="relu", path=task_path, source=TASK), _write(tmp_path / "model_new.py")
    )
    judge = LocalJudge(JudgeSettings(compile_mode="none"), "cpu", tmp_path)
    judged = asyncio.run(judge.evaluate(candidate))
    server.join(30)
    listener.close()
    assert requests and NO_SERVICE_FLAG in requests[0]["argv"] and str(task_path) in requests[0]["argv"]
    assert judged.status == "judged" and judged.via_service
    row = result_row(candidate, judged, None)
    assert (row.reward, row.judge_service) == (2, True)
    assert row.phase_s == {"build": 9.5, "verify": 3.0, "profile": 1.5}
    assert row.steps_s["worker.compile_baseline"] == 6.25
    assert (row.lock_wait_s, row.build_lock_wait_s) == (4.0, 0.25)
    # A row from results.jsonl of an earlier version (no breakdown) still reads.
    assert (
        TaskResult.model_validate_json(row.model_dump_json(exclude={"steps_s", "judge_service"})).steps_s
        == {}
    )
