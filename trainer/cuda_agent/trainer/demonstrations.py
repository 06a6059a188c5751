"""Demonstration trajectories for a TrainingRun's warm-up (RFT, then value pretraining).

A base policy as small as the local demo's rarely earns a positive reward, so RFT on its own rollouts has
nothing to keep. Demonstrations are reference solutions (examples/solutions/<task>/cpu* or cuda*, for the
device the episodes judge on) replayed through the real agent loop: the policy's turns are recorded tool
calls (Write the solution files, then, when the run allows more turns, Bash `verify`, then stop), run
against a sandbox server configured as the run's SandboxPool on this machine with the real judge, tokenized
with the run's model tokenizer and chat template, with the run's episode settings (cuda_agent.api.episode:
tools, limits, device, judge options; read from the run file, so they cannot drift). Each record carries
the judge's reward.

    python -m cuda_agent.trainer.demonstrations -f examples/trainingrun-local.yaml \\
        --tasks relu_mul_add,row_sum -o examples/trajectories/local-demo.jsonl

Log-probs of the replayed turns are 0.0 (nothing was sampled): fine for RFT's NLL loss and the critic's
value targets, not for PPO ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cuda_agent.agent.chat import ChatCodec
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.loop import AgentLoop
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.episode import episode_settings, on_this_machine
from cuda_agent.api.judge import Device
from cuda_agent.api.loader import load_resource_file
from cuda_agent.api.pool_server import server_config
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.api.sandboxpool import SandboxPool
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.rollout.base import SamplingParams
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.local import local_server
from cuda_agent.storage.claims import prepare_pvc_root
from cuda_agent.trainer.rollout import run_codec

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
SOLUTIONS = REPO_ROOT / "examples" / "solutions"


def run_documents(path: Path) -> tuple[TrainingRun, SandboxPool | None]:
    """The TrainingRun of a run file and the SandboxPool it names, when the file defines it."""
    resources = load_resource_file(path)
    runs = [r for r in resources if isinstance(r, TrainingRun)]
    if len(runs) != 1:
        raise ValueError(f"{path}: expected exactly one TrainingRun, found {len(runs)}")
    run = runs[0]
    pools = [
        r
        for r in resources
        if isinstance(r, SandboxPool) and r.metadata.name == run.spec.sandbox_pool_ref.name
    ]
    return run, (pools[0] if pools else None)


def agent_config(run: TrainingRun, pool: SandboxPool | None) -> AgentConfig:
    """The config of the run's training episodes on a server of `pool` on this machine, as the trainer's
    agent rollout builds it from the episode settings the local executor hands it."""
    placed = on_this_machine(pool.spec) if pool is not None else None
    return AgentConfig.for_episode(episode_settings(run.spec, placed))


def load_codec(run: TrainingRun) -> ChatCodec:
    """The run's tokenizer and chat template with the run's tools (pvc:// under CUDA_AGENT_PVC_ROOT)."""
    return run_codec(run.spec)


def run_tasks(run: TrainingRun) -> list[TaskRef]:
    from cuda_agent.trainer.data import load_tasks

    return load_tasks(run.spec.dataset.uri)


def solution_files(task: str, device: Device = "cpu", solutions: Path = SOLUTIONS) -> dict[str, str]:
    """Workspace path -> content of the task's reference solution for `device` (`cpu/`, else `cpu_ws/`;
    `cuda/`, else `cuda_ws/`)."""
    for variant in (device, f"{device}_ws"):
        root = solutions / task / variant
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            return {str(p.relative_to(root)): p.read_text() for p in files}
    raise FileNotFoundError(f"no {device} solution for task {task!r} under {solutions}/{task}/{device}*")


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def demonstration_replies(files: Mapping[str, str], max_turns: int) -> list[str]:
    """The policy's turns: write every solution file; then, if the run allows the turns, verify and stop."""
    writes = "\n".join(
        tool_call("Write", {"file_path": path, "content": text}) for path, text in files.items()
    )
    script = [
        "I will write ModelNew with a C++ extension that computes the whole forward in one pass.\n" + writes,
        "Now I check it.\n" + tool_call("Bash", {"command": "verify"}),
        "ModelNew is written and verified; I am done.",
    ]
    return script[:max_turns]


@contextmanager
def sandbox_server(pool: SandboxPool | None, parent: Path | None = None) -> Iterator[str]:
    """`cuda-agent sandbox serve` with the config the run's pool gives its servers, placed on this machine
    as the operator's local executor places it (cuda_agent.sandbox.local: loopback, the installed real
    judge, the pool's GPUs this machine has; without a pool, the server's defaults); yields its URL."""
    settings = server_config(on_this_machine(pool.spec)) if pool is not None else {}
    with local_server(settings, parent) as url:
        yield url


async def demonstrate(
    url: str, codec: ChatCodec, config: AgentConfig, task: TaskRef, replies: list[str]
) -> Trajectory:
    """One replayed episode through the agent loop, judged by the server's judge."""
    from cuda_agent.sandbox.client import SandboxClient

    async with SandboxClient(url) as sandbox:
        loop = AgentLoop(ReplayBackend(replies, codec.tokenizer), sandbox, codec, config)
        return await loop.run(task, SamplingParams(temperature=0.0), episode_id=f"demo-{task.name}")


def problems(trajectory: Trajectory, min_reward: int) -> list[str]:
    """Why a demonstration is not fit for the run's RFT set (empty when it is)."""
    found = []
    if trajectory.reward < min_reward:
        summary = trajectory.verdict.summary[-500:] if trajectory.verdict else ""
        found.append(f"reward {trajectory.reward} < {min_reward}: {summary}")
    if trajectory.end not in ("finished", "max_turns"):
        found.append(f"ended at {trajectory.end} ({trajectory.error})")
    if trajectory.invalid_tool_calls or any(t.tool_errors for t in trajectory.turns):
        found.append(f"tool errors: {[t.tool_errors for t in trajectory.turns]}")
    if not any(trajectory.loss_mask):
        found.append("no policy token")
    return found


def tampered(trajectory: Trajectory) -> bool:
    verdict = trajectory.verdict
    return verdict is not None and any("judge-tampered" in v for v in [*verdict.violations, verdict.summary])


def judged_episode(
    pool: SandboxPool | None,
    codec: ChatCodec,
    config: AgentConfig,
    task: TaskRef,
    replies: list[str],
    attempts: int,
) -> Trajectory:
    """The episode on a fresh server; again (up to `attempts`) when the judge's files changed under it: the
    server refuses to judge with files that differ from those it hashed at startup, as it must, and on a
    working tree that someone is editing that is a reason to start over, not a verdict."""
    for attempt in range(1, attempts + 1):
        with sandbox_server(pool) as url:
            trajectory = asyncio.run(demonstrate(url, codec, config, task, replies))
        if not tampered(trajectory) or attempt == attempts:
            break
        print(f"{task.name}: the judge's files changed during attempt {attempt}; starting over", flush=True)
        time.sleep(10)
    return trajectory


def generate(
    run_file: Path, task_names: list[str] | None, output: Path, attempts: int = 3
) -> list[Trajectory]:
    run, pool = run_documents(run_file)
    config = agent_config(run, pool)
    with tempfile.TemporaryDirectory(prefix="cuda-agent-pvc-") as pvc:
        # pvc://models and pvc://examples as the demo mounts them
        os.environ["CUDA_AGENT_PVC_ROOT"] = str(prepare_pvc_root(Path(pvc)))
        codec = load_codec(run)
        tasks = {t.name: t for t in run_tasks(run)}
    chosen = task_names or sorted(tasks)
    unknown = [n for n in chosen if n not in tasks]
    if unknown:
        raise ValueError(f"tasks {unknown} are not in the run's dataset {run.spec.dataset.uri}")
    kept: list[Trajectory] = []
    for name in chosen:
        replies = demonstration_replies(solution_files(name, config.device), config.max_turns)
        trajectory = judged_episode(pool, codec, config, tasks[name], replies, attempts)
        found = problems(trajectory, run.spec.warmup.rft.min_reward)
        print(
            f"{name}: reward {trajectory.reward}, end {trajectory.end}, {len(trajectory.token_ids)} tokens "
            f"({trajectory.prompt_length} prompt, {sum(trajectory.loss_mask)} policy), "
            f"{trajectory.wall_s:.0f} s" + (f"; SKIPPED: {'; '.join(found)}" if found else ""),
            flush=True,
        )
        if not found:
            kept.append(trajectory)
    if not kept:
        raise RuntimeError("no demonstration passed; nothing written")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(t.to_json() + "\n" for t in kept))
    print(f"wrote {len(kept)} trajectories to {output} ({output.stat().st_size} bytes)")
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_agent.trainer.demonstrations", description=__doc__)
    parser.add_argument("-f", "--file", type=Path, required=True, help="run file (TrainingRun + SandboxPool)")
    parser.add_argument("--tasks", help="comma-separated task names (default: every task of the dataset)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="JSON-lines file to write")
    parser.add_argument(
        "--attempts", type=int, default=3, help="episodes per task when the judge's files change under it"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    try:
        generate(args.file, tasks, args.output, args.attempts)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
