"""`cuda-agent train -f run.yaml`: the entry point the operator's driver pod (or local executor) runs.

Reads the TrainingRun, the operator <-> trainer environment (cuda_agent.api.run_contract), builds the roles
(on Ray when spec.trainer.useRay) and the rollout, and trains, resuming from CUDA_AGENT_RESUME_FROM or the
newest checkpoint under the checkpoint prefix. Exit codes: 0 finished or suspended, 1 failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.api.loader import ResourceError, load_resource
from cuda_agent.api.run_contract import TrainerEnv, TrainerProgress
from cuda_agent.api.trainingrun import TrainingRun, TrainingRunPhase
from cuda_agent.runstatus import StatusWriter, open_status_writer

log = logging.getLogger("cuda_agent.trainer")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuda-agent train", description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--file", required=True, type=Path, help="TrainingRun YAML (run.yaml)")
    parser.add_argument(
        "--rollout",
        default="cuda_agent.trainer.rollout:agent_rollout",
        help="MODULE:FUNCTION returning the rollout for (run, env) or (run, env, workers); default: the "
        "agent loop, over vLLM engines on Ray on a GPU cluster",
    )
    return parser


def load_run(path: Path) -> TrainingRun:
    return load_resource(path.read_text(), TrainingRun, source_name=str(path))


def checkpoint_prefix(run: TrainingRun, env: TrainerEnv) -> str:
    """CUDA_AGENT_CHECKPOINT_PREFIX, else spec.checkpoint.prefix, else ./cuda-agent-runs/NAME/checkpoints."""
    return (
        env.checkpoint_prefix
        or run.spec.checkpoint.prefix
        or str(Path.cwd() / "cuda-agent-runs" / env.run_name / "checkpoints")
    )


def last_position(run: TrainingRun, env: TrainerEnv) -> tuple[int, str | None]:
    """PPO steps and checkpoint of the newest checkpoint (0, None when there is none or it cannot be read),
    so a report made before training starts does not reset the run's status.step."""
    try:
        from cuda_agent.trainer.checkpoint import CheckpointStore, peek_state

        uri = (
            env.resume_from or CheckpointStore(checkpoint_prefix(run, env), run.spec.checkpoint.keep).latest()
        )
        return (peek_state(uri).ppo_step, uri) if uri else (0, None)
    except Exception:
        log.exception("could not read the last checkpoint")
        return 0, None


def suspend_watch(path: Path, env: TrainerEnv) -> Callable[[], bool]:
    """spec.suspend as it is now: read from the apiserver in kubernetes mode, else from the run file
    (which the local executor rewrites)."""
    if env.status_mode == "kubernetes":
        from kubernetes import client

        from cuda_agent.api.base import GROUP, VERSION

        api = client.CustomObjectsApi()

        def from_cluster() -> bool:
            obj: Any = api.get_namespaced_custom_object(
                GROUP, VERSION, env.run_namespace, TrainingRun.plural, env.run_name
            )
            return bool(obj.get("spec", {}).get("suspend", False))

        return from_cluster

    def from_file() -> bool:
        try:
            return load_run(path).spec.suspend
        except (OSError, ResourceError):
            return False

    return from_file


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    from cuda_agent.telemetry import configure_telemetry

    configure_telemetry(service_name="cuda-agent-trainer")
    try:
        run = load_run(args.file)
        env = TrainerEnv.from_environ(os.environ, default_run_name=run.metadata.name or "local")
    except (OSError, ResourceError, ValueError) as exc:
        print(f"cuda-agent train: {exc}", file=sys.stderr)
        return 2
    status = open_status_writer(env)
    if run.spec.suspend:
        step, checkpoint = last_position(run, env)
        progress = TrainerProgress(
            phase=TrainingRunPhase.SUSPENDED,
            step=step,
            stage="ppo",
            last_checkpoint=checkpoint,
            message="spec.suspend is true",
        )
        _write(status, progress)
        return 0
    try:
        return train(run, env, args.file, args.rollout, status)
    except Exception as exc:
        log.exception("training failed")
        step, checkpoint = last_position(run, env)
        message = f"{type(exc).__name__}: {exc}"[:4000]
        progress = TrainerProgress(
            phase=TrainingRunPhase.FAILED, step=step, stage="ppo", last_checkpoint=checkpoint, message=message
        )
        _write(status, progress)
        return 1


def train(run: TrainingRun, env: TrainerEnv, path: Path, rollout_target: str, status: StatusWriter) -> int:
    from cuda_agent.telemetry import Stage, span
    from cuda_agent.trainer.checkpoint import CheckpointStore
    from cuda_agent.trainer.data import TaskOrder, load_tasks
    from cuda_agent.trainer.driver import Stopped, Trainer, Workers

    spec = run.spec
    workers: Workers
    if spec.trainer.use_ray:
        from cuda_agent.trainer.ray.workers import RayWorkers

        workers = RayWorkers.build(spec, env)
    else:
        from cuda_agent.trainer.workers import LocalWorkers

        workers = LocalWorkers.build(spec)
    # After the roles: a factory that takes the workers too places its engines by their placement groups.
    module_name, _, func_name = rollout_target.partition(":")
    factory = getattr(importlib.import_module(module_name), func_name)
    takes_workers = len(inspect.signature(factory).parameters) >= 3
    rollout = factory(run, env, workers) if takes_workers else factory(run, env)
    # Which rollout backend runs, and where: in the log and in every status report (status.rollout).
    description = str(getattr(rollout, "description", None) or rollout_target)[:256]
    log.info("rollout: %s", description)
    status = RolloutReported(status, description)
    trainer = Trainer(
        run=run,
        rollout=rollout,
        workers=workers,
        status=status,
        checkpoints=CheckpointStore(checkpoint_prefix(run, env), spec.checkpoint.keep),
        order=TaskOrder(load_tasks(spec.dataset.uri), spec.trainer.seed),
        suspend_requested=suspend_watch(path, env),
        resume_from=env.resume_from,
        report_dir=Path.cwd(),
    )
    try:
        with span(Stage.RUN, run=env.run_name, namespace=env.run_namespace):
            trainer.train()
    except Stopped:
        log.info("suspended; last checkpoint %s", trainer.last_checkpoint)
    except Exception as exc:
        # Reported with the step and checkpoint reached; a restarted trainer resumes from that checkpoint.
        log.exception("training failed")
        message = f"{trainer.state.stage} step {trainer.state.stage_step + 1}: {type(exc).__name__}: {exc}"
        progress = TrainerProgress(
            phase=TrainingRunPhase.FAILED,
            step=trainer.state.ppo_step,
            stage=trainer.state.stage or "ppo",
            last_checkpoint=trainer.last_checkpoint,
            message=message[:4000],
        )
        _write(status, progress)
        return 1
    return 0


class RolloutReported:
    """A status writer whose every report names the rollout backend (the trainer's driver reports
    progress; which rollout it drives is known where the rollout is built)."""

    def __init__(self, writer: StatusWriter, rollout: str) -> None:
        self.writer, self.rollout = writer, rollout

    def write(self, progress: TrainerProgress) -> None:
        self.writer.write(progress.model_copy(update={"rollout": self.rollout}))


def _write(status: StatusWriter, progress: TrainerProgress) -> None:
    try:
        status.write(progress)
    except Exception:
        log.exception("status write failed")
