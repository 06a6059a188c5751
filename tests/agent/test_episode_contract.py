"""The episode contract at the sandbox server's boundary: what a TrainingRun's spec.reward and its
SandboxPool's GPUs become is checked where a real sandbox server receives it, not on a config object.

The path is the real one: the operator's `trainer_env` (the pool it observed, the run's spec) -> the
environment a trainer process gets -> `TrainerEnv.from_environ` -> the trainer's `AgentRollout` (the agent
loop on the transformers backend, a tiny random-init policy with SmolLM2's tokenizer) -> a real sandbox
server. A pass-through recorder sits between the client and the server and keeps every request body the
server receives (session create, the final judge call) and every answer; the server runs the tests' fake
judge, which reads the command line the server started it with through the real judge CLI's code and
reports the JudgeConfig it built, so the options are checked where the judge process has them. The server
is started with `--gpus 1` on a machine that may have none: the fake judge needs no GPU, and the server
accepts CUDA sessions only when it has GPUs, which this way it has.

`cuda-agent eval --run FILE` is checked the same way: its episodes end at the run's maxTurnsEval (not
maxTurnsTrain) and its sessions carry the pool's device and the run's judge options.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_helpers import EXAMPLES, start_sandbox
from sandbox_helpers import TASK, RunningServer, cleanup

from cuda_agent.api.episode import on_this_machine
from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.operator.run_children import RunContext, trainer_env

TINY_POLICY = EXAMPLES / "models" / "tiny-smollm2"  # SmolLM2's tokenizer and chat template, 2 layers
# Every field of spec.reward away from its default, so a field that is dropped shows as the default.
REWARD = {"precision": "tf32", "tolerance": {"atol": 0.003, "rtol": 0.004}, "speedupMargin": 0.2}
# What the judge process ran with (its JudgeConfig, as the fake judge's CLI code built it).
JUDGE_CONFIG = {"precision": "tf32", "atol": 0.003, "rtol": 0.004, "margin": 0.2}


@dataclass
class Recorder:
    """A pass-through HTTP proxy in front of the real server, in a thread of its own: every request it
    forwards is kept as (method, path, JSON body, JSON answer)."""

    upstream: str
    url: str = ""
    calls: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    def bodies(self, method: str, suffix: str) -> list[Any]:
        return [body for m, path, body, _ in self.calls if m == method and path.endswith(suffix)]

    def answers(self, method: str, suffix: str) -> list[Any]:
        return [answer for m, path, _, answer in self.calls if m == method and path.endswith(suffix)]


@pytest.fixture
def recorder(gpu_server: RunningServer) -> Iterator[Recorder]:
    import aiohttp
    from aiohttp import web

    recorder = Recorder(gpu_server.url.rstrip("/"))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                recorder.upstream + request.path_qs,
                data=body,
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as answer,
        ):
            text = await answer.read()
            status, content_type = answer.status, answer.headers.get("Content-Type", "application/json")
        recorder.calls.append(
            (request.method, request.path, json.loads(body) if body else None, _json_or_text(text))
        )
        return web.Response(status=status, body=text, headers={"Content-Type": content_type})

    async def serve() -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        recorder.url = f"http://127.0.0.1:{port}"
        ready.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(30), "the recorder did not start"
    try:
        yield recorder
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


@pytest.fixture(scope="module")
def gpu_server() -> Iterator[RunningServer]:
    running = start_sandbox("--gpus", "1")
    try:
        yield running
    finally:
        cleanup(running)


def pool(gpus: int) -> SandboxPoolSpec:
    return SandboxPoolSpec.model_validate(
        {"image": "cuda-agent-sandbox:0.1.0", "gpu": {"resourceName": "nvidia.com/gpu", "count": gpus}}
    )


def training_run(**agent: Any) -> TrainingRun:
    return TrainingRun.model_validate(
        {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "contract"},
            "spec": {
                "model": {"base": str(TINY_POLICY), "randomInit": True},
                "dataset": {"uri": "/unused"},
                "sandboxPoolRef": {"name": "pool"},
                "agent": {"maxContextTokens": 2400, "tools": ["bash", "read", "write", "edit"], **agent},
                "reward": REWARD,
                "warmup": {"singleTurnPpo": {"enabled": False, "maxContextTokens": 2048}},
                "trainer": {"engine": "torch", "precision": "fp32", "useRay": False},
            },
        }
    )


def trainer_environment(run: TrainingRun, observed: SandboxPoolSpec, sandbox_url: str) -> TrainerEnv:
    """What a trainer process started by the operator reads: the operator's env, through os.environ."""
    context = RunContext(
        name="contract",
        namespace="team",
        uid="uid",
        image="img",
        artifacts_secret="artifacts",
        checkpoint_prefix="s3://b/p",
        otel_endpoint=None,
        resume_from=None,
        pool=observed,
    )
    environ = trainer_env(context, run.spec, sandbox_url, ray_address=None).to_environ()
    return TrainerEnv.from_environ(environ)


def judge_config(answer: Any) -> dict[str, Any]:
    """The judge's JudgeConfig as the fake judge reports it (built by the judge CLI's own code from what the
    server passed), flattened to the options' names."""
    config: dict[str, Any] = answer["result"]["config"]
    return {**config, **config["tolerances"]}


@pytest.mark.parametrize(("gpus", "device"), [(1, "cuda"), (0, "cpu")])
def test_training_sessions_get_the_pools_device_and_the_runs_reward_policy(
    recorder: Recorder, gpus: int, device: str
) -> None:
    from cuda_agent.trainer.rollout import AgentRollout, RolloutRequest

    run = training_run()
    env = trainer_environment(run, pool(gpus), recorder.url)
    rollout = AgentRollout(run, env)
    request = RolloutRequest(
        stage="ppo",
        step=0,
        tasks=[TaskRef(source=TASK, name="relu")],
        episode_ids=["ppo-000000-00000"],
        max_turns=1,
        max_context_tokens=2400,
        seed=7,
    )
    [trajectory] = asyncio.run(rollout.generate(request))
    assert trajectory.end != "sandbox_error", trajectory.error

    [create] = recorder.bodies("POST", "/v1/sessions")
    assert create["device"] == device
    judge = create["judge"]
    assert (judge["precision"], judge["atol"], judge["rtol"], judge["margin"]) == ("tf32", 0.003, 0.004, 0.2)
    [answer] = recorder.answers("POST", "/judge")
    config = judge_config(answer)
    assert {name: config[name] for name in JUDGE_CONFIG} == JUDGE_CONFIG
    assert config["device"] == device
    # The rollout's policy copy is where the trainer's GPU is, if it has one.
    import torch

    assert rollout.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert rollout.description.startswith(f"transformers in process on {rollout.device.type}")


def test_local_pool_on_a_machine_without_the_pools_gpu_judges_on_this_machine() -> None:
    """The local demo's pool asks for a GPU of kwok's fake nodes; placed on a machine with none, its server
    judges on the CPU and its sessions ask for that (the local executor's and demonstrations' placement)."""
    assert on_this_machine(pool(1), gpus=0).gpu.count == 0
    assert on_this_machine(pool(1), gpus=8).gpu.count == 1
    assert on_this_machine(pool(0), gpus=8).gpu.count == 0


def test_eval_episodes_end_at_max_turns_eval_with_the_runs_judge_options(
    recorder: Recorder, tmp_path: Path
) -> None:
    """`cuda-agent eval --run`: a replay policy that would go on calling tools is stopped at the run's
    maxTurnsEval (2), not its maxTurnsTrain (4); its session asks for the pool's device and spec.reward."""
    from cuda_agent.eval import cli
    from cuda_agent.eval.runner import ResultLog

    run = training_run(maxTurnsTrain=4, maxTurnsEval=2)
    run_file = tmp_path / "run.yaml"
    pool_document = {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "pool"},
        "spec": pool(1).model_dump(mode="json", by_alias=True, exclude_unset=True),
    }
    run_document = run.model_dump(mode="json", by_alias=True, exclude_unset=True)
    run_file.write_text(yaml.safe_dump_all([pool_document, run_document]))
    bash = {"name": "Bash", "arguments": {"command": "echo turn"}}
    reply = "Checking.\n<tool_call>\n" + json.dumps(bash) + "\n</tool_call>"
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([reply] * 6))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "relu.py").write_text(TASK)
    out = tmp_path / "out"
    args = ["--run", str(run_file), "--policy", f"replay:{script}", "--tokenizer", str(TINY_POLICY)]
    args += ["--tasks", str(tasks), "--sandbox", recorder.url, "--out", str(out), "--no-progress"]
    # The local placement decides the device: a machine without GPUs judges (and asks) on its CPU.
    expected = "cuda" if on_this_machine(pool(1)).gpu.count else "cpu"
    assert cli.main(args) == 0

    row = ResultLog(out / "results.jsonl").rows["tasks/relu"]
    assert (row.episode_end, row.turns) == ("max_turns", 2), row
    [create] = recorder.bodies("POST", "/v1/sessions")
    assert create["device"] == expected
    judge = create["judge"]
    assert (judge["precision"], judge["atol"], judge["rtol"], judge["margin"]) == ("tf32", 0.003, 0.004, 0.2)
    [answer] = recorder.answers("POST", "/judge")
    config = judge_config(answer)
    assert {name: config[name] for name in JUDGE_CONFIG} == JUDGE_CONFIG
    assert cli.main([*args, "--max-turns", "3"]) == 2  # the run file decides the turn limit
