"""Which rollout backend a trainer uses, and where, reaches the run's status: every report `cuda-agent train`
writes carries the rollout's description, and the status patch the trainer sends the apiserver holds it as
`status.rollout` (the file writer records that patch as it is)."""

from __future__ import annotations

import json
from pathlib import Path

from cuda_agent.api.run_contract import TrainerProgress
from cuda_agent.api.trainingrun import TrainingMetrics, TrainingRunPhase, TrainingRunStatus
from cuda_agent.runstatus import FileStatusWriter
from cuda_agent.trainer.cli import RolloutReported


def test_every_report_names_the_rollout(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    writer = RolloutReported(FileStatusWriter(str(path)), "transformers in process on cuda (bf16)")
    writer.write(TrainerProgress(phase=TrainingRunPhase.WARMING_UP, step=0, stage="rft"))
    metrics = TrainingMetrics(mean_reward=1.0, pass_rate=0.5)
    writer.write(TrainerProgress(phase=TrainingRunPhase.RUNNING, step=1, stage="ppo", metrics=metrics))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["status"]["rollout"] for line in lines] == ["transformers in process on cuda (bf16)"] * 2
    # What the apiserver would get is a valid status of the TrainingRun model.
    status = TrainingRunStatus.model_validate(lines[1]["status"])
    assert (status.rollout, status.step) == ("transformers in process on cuda (bf16)", 1)
