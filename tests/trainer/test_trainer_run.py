"""The trainer's main loop: stages in order, exact resume, suspend, and `cuda-agent train -f` killed
mid-step and restarted (no episode counted twice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from scripted_rollout import ScriptedRollout  # tests/trainer is on sys.path (rootdir conftest)

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.runstatus import FileStatusWriter
from cuda_agent.trainer.checkpoint import CheckpointStore, TrainerState
from cuda_agent.trainer.data import TaskOrder, load_tasks
from cuda_agent.trainer.driver import Stopped, Trainer, history_value
from cuda_agent.trainer.workers import LocalWorkers

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
RUN_SPEC: dict[str, Any] = {
    "dataset": {"uri": str(TASKS)},
    "warmup": {
        "singleTurnPpo": {"enabled": True, "steps": 1, "maxContextTokens": 1024},
        "rft": {"enabled": True, "epochs": 1},
        "valuePretraining": {"enabled": True, "maxEpochs": 1},
    },
    "agent": {"maxContextTokens": 1024},
}


def make_trainer(run: TrainingRun, prefix: Path, rollout: ScriptedRollout, **kwargs: Any) -> Trainer:
    return Trainer(
        run=run,
        rollout=rollout,
        workers=LocalWorkers.build(run.spec),
        status=FileStatusWriter(str(prefix / "status.jsonl")),
        checkpoints=CheckpointStore(str(prefix / "ckpt"), keep=2),
        order=TaskOrder(load_tasks(run.spec.dataset.uri), run.spec.trainer.seed),
        **kwargs,
    )


def policy_params(trainer: Trainer) -> list[torch.Tensor]:
    workers = trainer.workers
    assert isinstance(workers, LocalWorkers)
    return [p.detach().clone() for p in workers.actor.module.parameters()]


@pytest.fixture(scope="module")
def uninterrupted(
    run_document: Callable[..., dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainingRun, TrainerState, list[torch.Tensor], Path]:
    run = TrainingRun.model_validate(run_document(**RUN_SPEC))
    prefix = tmp_path_factory.mktemp("uninterrupted")
    trainer = make_trainer(run, prefix, ScriptedRollout())
    state = trainer.train()
    return run, state, policy_params(trainer), prefix


def test_stages_run_in_order_and_report_status(uninterrupted: Any) -> None:
    run, state, _, prefix = uninterrupted
    assert state.completed_stages == ["single_turn_ppo", "rft", "value_pretraining", "ppo"]
    assert state.ppo_step == run.spec.algorithm.steps == 3
    assert state.episodes == 4 * run.spec.algorithm.batch_size  # 1 single-turn + 3 PPO batches
    lines = [json.loads(line) for line in (prefix / "status.jsonl").read_text().splitlines()]
    phases = [line["progress"]["phase"] for line in lines]
    assert phases[0] == "WarmingUp" and phases[-1] == "Succeeded" and "Running" in phases
    assert lines[-1]["status"]["step"] == 3
    assert lines[-1]["status"]["lastCheckpoint"].startswith(str(prefix / "ckpt"))
    assert any("meanReward" in line["status"].get("metrics", {}) for line in lines)
    for key in (
        "reward",
        "pass_rate",
        "entropy",
        "clip_fraction",
        "kl",
        "explained_variance",
        "response_length",
        "rollout_s",
        "actor_update_s",
        "weight_sync_s",
        "train_tokens_per_s_per_gpu",
    ):
        assert history_value(state, "ppo", 3, key) is not None, key
    assert history_value(state, "rft", 1, "nll") is not None
    assert history_value(state, "value_pretraining", 1, "value_loss") is not None
    # single-turn PPO asked the rollout for one turn at its own context
    single = json.loads(
        (prefix / "ckpt" / "episodes" / "single_turn_ppo" / "step-000000.jsonl").read_text().splitlines()[0]
    )
    assert single["end"] == "finished"
    kept = sorted(p.parent.name for p in (prefix / "ckpt").glob("ckpt-*/state.json"))
    assert len(kept) == 2  # keep=2 in make_trainer (an object store has no empty directories to count)


def test_resume_after_a_crash_continues_exactly(uninterrupted: Any, tmp_path: Path) -> None:
    run, want, want_params, want_prefix = uninterrupted
    crashing = make_trainer(run, tmp_path, ScriptedRollout(fail_at=("ppo", 2)))
    with pytest.raises(RuntimeError, match="scripted failure"):
        crashing.train()
    resumed = make_trainer(run, tmp_path, ScriptedRollout())
    state = resumed.train()
    # The step after the crash drew the same tasks and episodes and computed the same losses.
    for name in ("step-000002.jsonl", "step-000001.jsonl"):
        text = (tmp_path / "ckpt" / "episodes" / "ppo" / name).read_text()
        assert text == (want_prefix / "ckpt" / "episodes" / "ppo" / name).read_text()
    for key in ("policy_loss", "value_loss", "explained_variance", "reward", "clip_fraction"):
        assert history_value(state, "ppo", 3, key) == history_value(want, "ppo", 3, key), key
    for got, expected in zip(policy_params(resumed), want_params, strict=True):
        assert torch.equal(got, expected)
    assert state.episodes == want.episodes


def test_suspend_checkpoints_and_stops_then_resumes(
    run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    spec = {
        **RUN_SPEC,
        "warmup": {
            "singleTurnPpo": {"enabled": False, "maxContextTokens": 1024},
            "rft": {"enabled": False},
            "valuePretraining": {"enabled": False},
        },
        "checkpoint": {"everySteps": 3},
    }
    run = TrainingRun.model_validate(run_document(**spec))
    suspended = make_trainer(run, tmp_path, ScriptedRollout(), suspend_requested=lambda: True)
    with pytest.raises(Stopped):
        suspended.train()
    assert suspended.last_checkpoint is not None  # written although everySteps=3
    last = json.loads((tmp_path / "status.jsonl").read_text().splitlines()[-1])
    assert last["progress"]["phase"] == "Suspended" and last["status"]["step"] == 1
    state = make_trainer(run, tmp_path, ScriptedRollout()).train()
    assert state.ppo_step == 3 and state.episodes == 3 * run.spec.algorithm.batch_size


def test_cli_killed_mid_step_resumes_without_counting_an_episode_twice(
    run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    spec = {
        **RUN_SPEC,
        "warmup": {
            "singleTurnPpo": {"enabled": False, "maxContextTokens": 1024},
            "rft": {"enabled": True},
            "valuePretraining": {"enabled": True, "maxEpochs": 1},
        },
    }
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(run_document(**spec)))
    status_file = tmp_path / "status.jsonl"
    env = {
        **os.environ,
        **TrainerEnv(
            run_name="tiny",
            checkpoint_prefix=str(tmp_path / "ckpt"),
            status_mode="file",
            status_file=str(status_file),
        ).to_environ(),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "CUDA_AGENT_TEST_KILL_AT": f"ppo:1:{tmp_path / 'killed'}",
    }
    command = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "train",
        "-f",
        str(run_file),
        "--rollout",
        "scripted_rollout:factory",
    ]
    first = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == -9, first.stderr[-3000:]
    assert (tmp_path / "killed").exists()
    second = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr

    ledger = sorted((tmp_path / "ckpt" / "episodes" / "ppo").glob("step-*.jsonl"))
    assert [p.name for p in ledger] == ["step-000000.jsonl", "step-000001.jsonl", "step-000002.jsonl"]
    ids = [json.loads(line)["episode_id"] for p in ledger for line in p.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 3 * 4
    latest = (tmp_path / "ckpt" / "latest").read_text()
    state = TrainerState.model_validate_json((tmp_path / "ckpt" / latest / "state.json").read_text())
    assert state.episodes == 3 * 4 and state.ppo_step == 3
    assert [h["step"] for h in state.history if h["stage"] == "ppo"] == [1, 2, 3]
    phases = [json.loads(line)["progress"]["phase"] for line in status_file.read_text().splitlines()]
    assert phases[-1] == "Succeeded"
    # The end-of-run report lands in the working directory (the run directory) and next to the checkpoints.
    assert (tmp_path / "curves.png").exists() and (tmp_path / "ckpt" / "report" / "summary.json").exists()


def test_cli_rejects_a_bad_run_file(tmp_path: Path) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_text(
        "apiVersion: cuda-agent.io/v1alpha1\nkind: TrainingRun\nmetadata: {name: x}\n"
        "spec:\n  algorithm: {clipLow: 2}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "cuda_agent.cli", "train", "-f", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "spec.algorithm.clipLow" in result.stderr
