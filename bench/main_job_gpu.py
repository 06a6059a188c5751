"""The main job on one GPU, the local executor's way (issue 29, item 4).

    python3 bench/main_job_gpu.py --out $OUT      # one H200: the whole job, 7 minutes (docs/performance.md)
    python3 bench/main_job_gpu.py --model tiny --scale small --ppo-steps 1 --batch 2 \
        --demo-tasks row_sum,row_max --deadline 1500    # a CPU smoke run of the same path (10 min here)

On the GPU host the package and the carried wheels go to a world-readable directory named by a `.pth` file
in the interpreter's site-packages (docs/performance.md has the command): the server's judges run as other
users and start `python -I`, so neither the checkout under the caller's home nor PYTHONPATH reaches them.

What runs is what `cuda-agent operator --executor local` starts for a TrainingRun, without the control
plane (no apiserver on the GPU host): a sandbox server with the config the run's SandboxPool gives its
servers, placed on this machine (`server_config(on_this_machine(pool))`: on a GPU host it judges on
`cuda`), and `cuda-agent train -f run.yaml` with the environment the operator hands a trainer
(`run_children.trainer_env`: the episode settings of the run and the placed pool, so every session asks
for a CUDA session with the run's spec.reward); status goes to a file instead of the apiserver.

The run: a random-init policy of Qwen2-0.5B's shape with SmolLM2-135M-Instruct's tokenizer and chat template
(examples/models/tiny-smollm2; the SmolLM2 GGUF is 94 MB, more than a device call carries), bf16, the
plain-torch engine without Ray (the GPU host has no DeepSpeed and no Ray), the in-process transformers
rollout on the GPU (vLLM's wheel does not fit a device call either), on the shipped example tasks at their
real sizes (`DEFAULT_SCALE = "full"`). Stages: RFT on demonstrations -> value pretraining -> PPO.
The demonstrations are the tasks' CUDA reference solutions replayed through the real agent loop against
the same server (cuda_agent.trainer.demonstrations), judged on the GPU, before the trainer starts; they
are generated at a longer context (`--demo-context`) than the PPO episodes (`--context`): a random-init
policy never stops on its own, so every PPO episode fills its context, and generation time is what the
PPO context buys. RFT, value pretraining and PPO use the trainer's defaults (issue 28) except value
pretraining's pass limit (`--value-epochs`, 5: 20 passes over 4 demonstrations cost 37 s and 4 checkpoints
of one H200 call's 10 minutes) and what the flags below say.

Measured per stage, from the run's own records: the trainer's and the server's OpenTelemetry spans (file
exporter: run > step > episode > turn > generate | tool_call | judge > judge_run > build | verify |
profile; each step span carries the step's metrics), the episodes the trainer recorded, and the GPU's
memory in use sampled with nvidia-smi once a second (trainer, rollout copy and judges together).
Results: $OUT/main_job.json, logs under $OUT; a short table is printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
TOKENIZER = REPO / "examples" / "models" / "tiny-smollm2"
# Demonstrations whose prompt and CUDA solution fit --demo-context (SmolLM2 tokens: prompt ~2.2k with four
# tools, solution 1.5-1.9k), shortest first.
DEMO_TASKS = "row_sum,row_max,gelu_sigmoid,cumsum"
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2-0.5B's shape (24 layers, hidden 896, 14 query / 2 key-value heads) with SmolLM2's vocabulary.
    "0.5b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "tiny": {},  # examples/models/tiny-smollm2's own config (2 layers, hidden 64)
}

# The GPU host has no Kubernetes client; the operator's pure manifest builder trainer_env imports it
# only for a type alias, so that module is registered without it.
if importlib.util.find_spec("kubernetes") is None and "cuda_agent.operator.kube" not in sys.modules:
    _kube = types.ModuleType("cuda_agent.operator.kube")
    _kube.Manifest = dict  # type: ignore[attr-defined]
    sys.modules["cuda_agent.operator.kube"] = _kube

from cuda_agent.api.episode import on_this_machine  # noqa: E402
from cuda_agent.api.pool_server import server_config  # noqa: E402
from cuda_agent.api.sandbox import machine_gpus  # noqa: E402
from cuda_agent.api.sandboxpool import SandboxPool, SandboxPoolSpec  # noqa: E402
from cuda_agent.api.trainingrun import TrainingRun  # noqa: E402
from cuda_agent.localhost import free_port  # noqa: E402
from cuda_agent.operator.run_children import RunContext, trainer_env  # noqa: E402
from cuda_agent.sandbox.local import local_settings, serve_command, write_config  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------- set-up


def prepare_model(work: Path, shape: str) -> Path:
    """A model directory: SmolLM2's tokenizer and chat template, and a config of the chosen shape
    (randomInit: the trainer builds the weights from it; nothing is downloaded)."""
    directory = work / "model"
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, directory / name)
    config = json.loads((TOKENIZER / "config.json").read_text())
    if SHAPES[shape]:
        config = {
            key: config[key]
            for key in ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size", "rms_norm_eps")
        }
        config |= SHAPES[shape] | {"max_position_embeddings": 32768, "rope_theta": 1_000_000.0}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def prepare_tasks(work: Path, scale: str) -> Path:
    """The example tasks at `scale` (full: their real sizes): each file's DEFAULT_SCALE line says it (a
    session gets the task's source, so the file itself must)."""
    directory = work / "tasks"
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(TASKS.glob("*.py")):
        text = path.read_text()
        assert 'DEFAULT_SCALE = "small"' in text, path
        (directory / path.name).write_text(
            text.replace('DEFAULT_SCALE = "small"', f'DEFAULT_SCALE = "{scale}"')
        )
    return directory


def documents(args: argparse.Namespace, model: Path, tasks: Path, demos: Path) -> tuple[dict, dict]:
    pool = {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "gpu", "namespace": "bench"},
        "spec": {
            "replicas": 1,
            "gpu": {"resourceName": "nvidia.com/gpu", "count": 1, "product": "NVIDIA-H200"},
            "image": "cuda-agent-sandbox:0.1.0",
            "limits": {"buildTimeoutSeconds": 300, "runTimeoutSeconds": 120, "memory": "32Gi"},
        },
    }
    rft: dict[str, Any] = {"enabled": True, "trajectoriesUri": str(demos)}
    if args.rft_epochs:
        rft["epochs"] = args.rft_epochs
    run = {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "main-job", "namespace": "bench"},
        "spec": {
            "model": {"base": str(model), "randomInit": True},
            "dataset": {"uri": str(tasks)},
            "sandboxPoolRef": {"name": "gpu"},
            "algorithm": {"steps": args.ppo_steps, "batchSize": args.batch},
            "agent": {
                "maxTurnsTrain": args.turns,
                "maxTurnsEval": args.turns,
                "maxContextTokens": args.context,
                "tools": ["bash", "read", "write", "edit"],
            },
            "warmup": {
                "singleTurnPpo": {"enabled": False, "maxContextTokens": min(args.context, 2048)},
                "rft": rft,
                "valuePretraining": {
                    "enabled": True,
                    **({"maxEpochs": args.value_epochs} if args.value_epochs else {}),
                },
            },
            "resources": {"trainerGpus": 1, "rolloutGpus": 0},
            # A checkpoint at the end of each stage only (0.5B actor + critic + AdamW: ~9 GB each).
            "checkpoint": {"everySteps": args.ppo_steps, "keep": 1},
            "trainer": {"engine": "torch", "precision": args.precision, "useRay": False},
        },
    }
    return pool, run


class Server:
    """`cuda-agent sandbox serve` as the local executor starts it for the run's pool (LocalExecutor._sandbox):
    the pool's server config placed on this machine, loopback, its own state directory and uid range."""

    def __init__(self, placed: SandboxPoolSpec, work: Path, out: Path, env: dict[str, str]) -> None:
        port = free_port()
        state = work / "sandbox"
        state.mkdir(parents=True, exist_ok=True)
        os.chmod(work, 0o711)
        os.chmod(state, 0o711)  # the sessions' uids must reach their workspaces below it
        settings = local_settings(server_config(placed), port, state / "state")
        self.config = settings
        config = write_config(settings, work / "sandbox.yaml")
        self.url = f"http://127.0.0.1:{port}"
        self.log = (out / "sandbox.log").open("ab")
        self.proc = subprocess.Popen(
            serve_command(config), stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the sandbox server exited ({self.proc.returncode}); see sandbox.log")
            try:
                import urllib.request

                with urllib.request.urlopen(f"{self.url}/v1/status", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("the sandbox server did not answer within 120 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)  # it waits for running judges; the run is over
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class GpuMemory:
    """nvidia-smi's memory.used of GPU 0, once a second, with wall-clock times (none without a GPU)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self.available:
            self._thread.start()

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
        while not self._stop.is_set():
            try:
                used = float(subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.strip())
                self.samples.append((time.time(), used / 1024))
            except (ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(1.0)

    def peak(self, start: float, end: float) -> float | None:
        inside = [gib for t, gib in self.samples if start <= t <= end]
        return round(max(inside), 1) if inside else None

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------------------- demonstrations


def demonstrations(
    run: TrainingRun, placed: SandboxPoolSpec, url: str, names: list[str], path: Path
) -> dict[str, Any]:
    """The tasks' reference solutions for the episodes' device, replayed through the agent loop against
    the run's server, all at once; the kept ones are the RFT set."""
    from cuda_agent.agent.config import AgentConfig
    from cuda_agent.api.episode import episode_settings
    from cuda_agent.trainer.demonstrations import (
        demonstrate,
        demonstration_replies,
        load_codec,
        problems,
        run_tasks,
        solution_files,
    )

    config = AgentConfig.for_episode(episode_settings(run.spec, placed))  # demonstrations.agent_config
    codec = load_codec(run)
    tasks = {t.name: t for t in run_tasks(run)}

    async def all_of_them() -> list[Any]:
        replies = [demonstration_replies(solution_files(n, config.device), config.max_turns) for n in names]
        return list(
            await asyncio.gather(
                *(demonstrate(url, codec, config, tasks[n], r) for n, r in zip(names, replies, strict=True))
            )
        )

    started = time.time()
    trajectories = asyncio.run(all_of_them())
    kept, rows = [], []
    for trajectory in trajectories:
        found = problems(trajectory, run.spec.warmup.rft.min_reward)
        rows.append(
            {
                "task": trajectory.task_name,
                "reward": trajectory.reward,
                "end": trajectory.end,
                "tokens": len(trajectory.token_ids),
                "wall_s": round(trajectory.wall_s, 1),
                "problems": found,
            }
        )
        log(
            f"demonstration {trajectory.task_name}: reward {trajectory.reward}, end {trajectory.end}, {found}"
        )
        if not found:
            kept.append(trajectory)
    path.write_text("".join(t.to_json() + "\n" for t in kept))
    return {
        "device": config.device,
        "context": config.max_context_tokens,
        "start": started,
        "end": time.time(),
        "episodes": rows,
        "kept": len(kept),
    }


# ------------------------------------------------------------------------------------------------ trainer


def train(
    run_file: Path,
    run: TrainingRun,
    placed: SandboxPoolSpec,
    url: str,
    work: Path,
    out: Path,
    env: dict[str, str],
    deadline: float,
) -> dict[str, Any]:
    """`cuda-agent train -f run.yaml` with the environment the operator's local executor gives it."""
    context = RunContext(
        name="main-job",
        namespace="bench",
        uid="bench",
        image="local",
        artifacts_secret="none",
        checkpoint_prefix=str(work / "checkpoints"),
        otel_endpoint=None,
        resume_from=None,
        pool=placed,
    )
    contract = trainer_env(context, run.spec, url, ray_address=None)
    contract = contract.model_copy(update={"status_mode": "file", "status_file": str(work / "status.jsonl")})
    environ = {k: v for k, v in env.items() if not k.startswith("CUDA_AGENT_")} | contract.to_environ()
    environ |= {
        "OTEL_TRACES_EXPORTER": "file",
        "CUDA_AGENT_TRACES_FILE": str(work / "traces-trainer.jsonl"),
        "CUDA_AGENT_LOG_FORMAT": "text",
        "PYTHONUNBUFFERED": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    command = [sys.executable, "-m", "cuda_agent.cli", "train", "-f", str(run_file)]
    started = time.time()
    with (out / "trainer.log").open("wb") as sink:
        proc = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=environ, cwd=work, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log("deadline: stopping the trainer (SIGTERM, then SIGKILL)")
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    return {
        "exit": code,
        "start": started,
        "end": time.time(),
        "episode_env": json.loads(contract.episode.model_dump_json()) if contract.episode else None,
    }


# ------------------------------------------------------------------------------------------------ analysis


def read_spans(*paths: Path) -> list[dict[str, Any]]:
    spans = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    with contextlib.suppress(ValueError):  # a line cut by a kill
                        spans.append(json.loads(line))
    return spans


def _time(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def analyse(work: Path, demos: dict[str, Any], trained: dict[str, Any], memory: GpuMemory) -> dict[str, Any]:
    spans = read_spans(
        work / "traces-trainer.jsonl", work / "traces-sandbox.jsonl", work / "traces-bench.jsonl"
    )
    by_id = {s["context"]["span_id"]: s for s in spans}

    def attribute(span: dict[str, Any], key: str) -> Any:
        return (span.get("attributes") or {}).get("cuda_agent." + key)

    def episode_of(span: dict[str, Any]) -> str | None:
        seen = 0
        while span is not None and seen < 64:
            found = attribute(span, "episode_id")
            if found:
                return str(found)
            span = by_id.get(span.get("parent_id") or "")
            seen += 1
        return None

    def stage_of(episode: str | None) -> str:
        if episode is None:
            return "other"
        if episode.startswith("demo-"):
            return "demonstrations"
        return episode.split("-", 1)[0]

    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for span in spans:
        if span["name"] in ("build", "verify", "profile", "judge_run", "tool_call", "generate", "judge"):
            seconds = _time(span["end_time"]) - _time(span["start_time"])
            phases[stage_of(episode_of(span))][span["name"]].append(seconds)
    steps = [s for s in spans if s["name"] == "step"]
    stages: dict[str, dict[str, Any]] = {}
    for step in sorted(steps, key=lambda s: s["start_time"]):
        stage = str(attribute(step, "stage"))
        entry = stages.setdefault(stage, {"steps": [], "start": _time(step["start_time"]), "end": 0.0})
        metrics = {
            k.removeprefix("cuda_agent."): v
            for k, v in (step.get("attributes") or {}).items()
            if k.startswith("cuda_agent.") and isinstance(v, int | float)
        }
        entry["steps"].append(metrics)
        entry["end"] = max(entry["end"], _time(step["end_time"]))
    for sync in (s for s in spans if s["name"] == "weight_sync"):
        stage = str(attribute(sync, "stage"))
        stages.setdefault(stage, {"steps": [], "start": _time(sync["start_time"]), "end": 0.0})
        stages[stage].setdefault("weight_sync_s", []).append(
            _time(sync["end_time"]) - _time(sync["start_time"])
        )
    episodes = episodes_by_stage(work / "checkpoints" / "episodes")
    result: dict[str, Any] = {"stages": {}}
    demo_entry = {"steps": [], "start": demos["start"], "end": demos["end"]}
    for stage, entry in [("demonstrations", demo_entry), *stages.items()]:
        record = summarise(stage, entry, phases.get(stage, {}), episodes.get(stage, []))
        record["gpu_memory_gib"] = memory.peak(entry["start"], entry["end"] or time.time())
        result["stages"][stage] = record
    result["reward_curve"] = [
        round(float(m.get("reward", float("nan"))), 3) for m in stages.get("ppo", {}).get("steps", [])
    ]
    return result


def episodes_by_stage(root: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if root.is_dir():
        for path in sorted(root.glob("*/step-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    found[path.parent.name].append(json.loads(line))
    return found


def summarise(
    stage: str, entry: dict[str, Any], phases: dict[str, list[float]], episodes: list[dict[str, Any]]
) -> dict[str, Any]:
    steps = entry["steps"]

    def total(key: str) -> float | None:
        values = [float(m[key]) for m in steps if key in m]
        return round(sum(values), 2) if values else None

    generated = sum(t.get("generated_tokens", 0) for e in episodes for t in e.get("turns", []))
    rollout_s = total("rollout_s")
    return {
        "wall_s": round(entry["end"] - entry["start"], 1) if entry["end"] else None,
        "steps": len(steps),
        "episodes": len(episodes),
        "generated_tokens": generated,
        "rollout_s": rollout_s,
        "generation_tokens_per_s": round(generated / rollout_s, 1) if rollout_s and generated else None,
        "generate_s": round(sum(phases.get("generate", [])), 1),
        "tool_calls": len(phases.get("tool_call", [])),
        "tool_s": round(sum(phases.get("tool_call", [])), 1),
        "judge_calls": len(phases.get("judge", [])),
        "judge_s": round(sum(phases.get("judge", [])), 1),
        "judge_runs": len(phases.get("judge_run", [])),
        "build_s": round(sum(phases.get("build", [])), 1),
        "verify_s": round(sum(phases.get("verify", [])), 1),
        "profile_s": round(sum(phases.get("profile", [])), 1),
        "experience_s": total("experience_s"),
        "actor_update_s": total("actor_update_s"),
        "critic_update_s": total("critic_update_s"),
        "weight_sync_s": round(sum(entry.get("weight_sync_s", [])), 2)
        if entry.get("weight_sync_s")
        else None,
        "rewards": [round(float(m["reward"]), 3) for m in steps if "reward" in m],
        "metrics": steps,
    }


def table(result: dict[str, Any]) -> str:
    header = (
        "| stage | wall s | steps | episodes | gen tok/s | tool s | judge s (build/verify/profile) | "
        "experience s | update s (actor/critic) | sync s | GPU GiB |"
    )
    lines = [header, "|" + "---|" * 11]
    for stage, r in result["stages"].items():

        def fmt(value: Any) -> str:
            return "-" if value is None else str(value)

        update = (
            "-"
            if r["actor_update_s"] is None and r["critic_update_s"] is None
            else f"{fmt(r['actor_update_s'])} / {fmt(r['critic_update_s'])}"
        )
        judge = f"{r['judge_s']} ({r['build_s']}/{r['verify_s']}/{r['profile_s']})"
        lines.append(
            f"| {stage} | {fmt(r['wall_s'])} | {r['steps']} | {r['episodes']} | "
            f"{fmt(r['generation_tokens_per_s'])} | {r['tool_s']} | {judge} | {fmt(r['experience_s'])} | "
            f"{update} | {fmt(r['weight_sync_s'])} | {fmt(r['gpu_memory_gib'])} |"
        )
    lines.append(f"PPO reward by step: {result['reward_curve']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "main-job-out")))
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/cuda-agent-main-job"))
    parser.add_argument("--model", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument(
        "--precision", choices=("bf16", "fp32"), default=None, help="bf16 on a GPU, else fp32"
    )
    parser.add_argument("--scale", choices=("full", "small"), default="full", help="task sizes (small: CPU)")
    parser.add_argument("--ppo-steps", type=int, default=5)
    parser.add_argument("--gpus", type=int, help="GPUs the server shares (default: its /dev/nvidiaN nodes)")
    parser.add_argument("--batch", type=int, default=12, help="episodes per PPO step (12: every task once)")
    parser.add_argument(
        "--turns", type=int, default=1, help="maxTurnsTrain (demonstrations: write, then judge)"
    )
    parser.add_argument("--context", type=int, default=2432, help="maxContextTokens of the PPO episodes")
    parser.add_argument(
        "--demo-context", type=int, default=4224, help="maxContextTokens of the demonstrations"
    )
    parser.add_argument("--demo-tasks", default=DEMO_TASKS, help="comma-separated tasks to demonstrate")
    parser.add_argument("--rft-epochs", type=int, default=None, help="default: the trainer's")
    parser.add_argument(
        "--value-epochs",
        type=int,
        default=5,
        help="valuePretraining.maxEpochs (0: the trainer's default, 20)",
    )
    parser.add_argument(
        "--deadline", type=float, default=565.0, help="seconds from start; the trainer is stopped"
    )
    args = parser.parse_args()
    begun = time.monotonic()
    deadline = begun + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    # This process only drives the demonstrations: it asks NVML, never creating a CUDA context of its own.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    import torch

    gpu = torch.cuda.is_available()
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    name = subprocess.run(query, capture_output=True, text=True).stdout.strip() if gpu else "none"
    log(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPU {name}; work {args.work}")
    result_machine = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": name}
    memory = GpuMemory()
    model = prepare_model(args.work, args.model)
    tasks = prepare_tasks(args.work, args.scale)
    demos_file = args.work / "demonstrations.jsonl"
    pool_doc, run_doc = documents(args, model, tasks, demos_file)
    run_file = args.work / "run.yaml"
    run_file.write_text(yaml.safe_dump(run_doc, sort_keys=False))  # what the run's ConfigMap holds
    pool, run = SandboxPool.model_validate(pool_doc), TrainingRun.model_validate(run_doc)
    demo_doc = json.loads(json.dumps(run_doc))
    demo_doc["spec"]["agent"]["maxContextTokens"] = args.demo_context
    demo_run = TrainingRun.model_validate(demo_doc)

    env = dict(os.environ)
    server_env = env | {
        "OTEL_TRACES_EXPORTER": "file",
        "CUDA_AGENT_TRACES_FILE": str(args.work / "traces-sandbox.jsonl"),
        "CUDA_AGENT_LOG_FORMAT": "text",
    }
    from cuda_agent.telemetry import configure_tracing
    from cuda_agent.telemetry.config import TelemetryConfig

    provider = configure_tracing(
        TelemetryConfig(traces_exporter="file", traces_file=str(args.work / "traces-bench.jsonl"))
    )
    # The pool as the local executor places it: its GPUs that this machine has (api/episode.on_this_machine).
    counted = machine_gpus()
    if gpu and counted == 0:
        log(f"WARNING: torch sees a GPU but there is no /dev/nvidiaN node ({glob.glob('/dev/nvidia*')})")
    placed = on_this_machine(pool.spec, args.gpus)
    server = Server(placed, args.work, args.out, server_env)
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": result_machine,
        "server": server.config,
    }
    try:
        log(f"sandbox server at {server.url}, GPUs {server.config['gpus']}")
        names = [n for n in args.demo_tasks.split(",") if n]
        demos = demonstrations(demo_run, placed, server.url, names, demos_file)
        provider.force_flush()
        log(f"demonstrations: {demos['kept']} of {len(names)} kept in {demos['end'] - demos['start']:.0f} s")
        result["demonstrations"] = demos
        if not demos["kept"]:
            raise RuntimeError("no demonstration was kept; RFT would have nothing")
        trained = train(run_file, run, placed, server.url, args.work, args.out, env, deadline)
        log(f"trainer exit {trained['exit']} after {trained['end'] - trained['start']:.0f} s")
        result["trainer"] = trained
    finally:
        server.stop()
        memory.stop()
        provider.shutdown()
    result |= analyse(args.work, result["demonstrations"], result.get("trainer", {}), memory)
    result["gpu_memory_samples"] = memory.samples[::5]
    result["status"] = [
        json.loads(line) for line in (args.work / "status.jsonl").read_text().splitlines() if line.strip()
    ] if (args.work / "status.jsonl").exists() else []  # fmt: skip
    result["wall_s"] = round(time.monotonic() - begun, 1)
    (args.out / "main_job.json").write_text(json.dumps(result, indent=2, default=str))
    for name in ("traces-trainer.jsonl", "traces-sandbox.jsonl", "summary.json", "curves.png"):
        if (args.work / name).exists() and (args.work / name).stat().st_size < 15 << 20:
            shutil.copy(args.work / name, args.out / name)
    print(table(result), flush=True)
    print(f"wall {result['wall_s']} s; trainer exit {result.get('trainer', {}).get('exit')}", flush=True)
    return 0 if result.get("trainer", {}).get("exit") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
