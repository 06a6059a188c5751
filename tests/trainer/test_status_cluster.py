"""The trainer's status writer and suspend watch against a real kube-apiserver (the local control plane):
the trainer-owned status fields (step, metrics, lastCheckpoint) land in the TrainingRun's status
subresource through the API models, phase and conditions stay the operator's, and spec.suspend is read
back from the object."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.cluster import KubeCluster

from cuda_agent.api.run_contract import TrainerEnv, TrainerProgress
from cuda_agent.api.trainingrun import TrainingMetrics, TrainingRunPhase
from cuda_agent.runstatus import open_status_writer


def run_object(name: str, suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "/models/x"},
            "dataset": {"uri": "/data/x"},
            "sandboxPoolRef": {"name": "pool"},
            "suspend": suspend,
        },
    }


def test_status_patch_and_suspend_watch(
    kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cuda_agent.trainer.cli import suspend_watch

    namespace = f"tr-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", namespace)
    try:
        kube_cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(run_object("r1", False))
        )
        monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
        env = TrainerEnv(run_name="r1", run_namespace=namespace, status_mode="kubernetes")
        writer = open_status_writer(env)
        writer.write(TrainerProgress(
            phase=TrainingRunPhase.RUNNING, step=7, stage="ppo",
            metrics=TrainingMetrics(mean_reward=1.25, pass_rate=0.5, faster_than_compile_rate=0.125),
            last_checkpoint="s3://ckpt/r1/ckpt-000003", message="ppo step 7 done",
        ))  # fmt: skip
        got = json.loads(
            kube_cluster.kubectl("get", "-n", namespace, "trainingrun", "r1", "-o", "json").stdout
        )
        status = got["status"]
        assert status["step"] == 7
        assert "phase" not in status and "conditions" not in status  # the operator's fields
        assert status["metrics"] == {"meanReward": 1.25, "passRate": 0.5, "fasterThanCompileRate": 0.125}
        assert status["lastCheckpoint"] == "s3://ckpt/r1/ckpt-000003"

        watch = suspend_watch(tmp_path / "unused.yaml", env)
        assert watch() is False
        kube_cluster.kubectl("patch", "-n", namespace, "trainingrun", "r1", "--type=merge",
                             "-p", json.dumps({"spec": {"suspend": True}}))  # fmt: skip
        assert watch() is True
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
