"""Status writers: how a trainer's progress reaches its TrainingRun.

The mode comes from the operator <-> trainer contract (`TrainerEnv.status_mode`): "kubernetes" patches the
trainer-owned fields of the TrainingRun's status subresource (step, metrics, lastCheckpoint, rollout) through
the API models; "file" appends one JSON line per report (tests and a trainer run by hand read it); "none"
only logs. The trainer (cli, driver) is its only user in the package; it is torch-free so tests import it
cheaply. The operator never reads it: its local executor hands the trainer status_mode "kubernetes" with a
token of the run's trainer ServiceAccount, as a pod gets.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from cuda_agent.api.base import GROUP, VERSION
from cuda_agent.api.run_contract import TrainerEnv, TrainerProgress
from cuda_agent.api.trainingrun import TrainingRun, TrainingRunStatus

log = logging.getLogger(__name__)


class StatusWriter(Protocol):
    def write(self, progress: TrainerProgress) -> None: ...


def progress_status(progress: TrainerProgress) -> TrainingRunStatus:
    """The trainer-owned part of the TrainingRun status that mirrors one progress report: step, metrics,
    last checkpoint, the rollout backend. Phase and conditions belong to the operator
    (operator/run_reconciler.py), which derives WarmingUp / Training from the driver's state and this step;
    a merge patch of these fields only leaves the operator's untouched."""
    return TrainingRunStatus(
        step=progress.step,
        metrics=progress.metrics,
        last_checkpoint=progress.last_checkpoint,
        rollout=progress.rollout,
    )


def status_patch(progress: TrainerProgress) -> dict[str, Any]:
    """The merge-patch body for the status subresource."""
    status = progress_status(progress).model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_unset=True
    )
    return {"status": status}


class KubernetesStatusWriter:
    """Patches the TrainingRun's status subresource (in-cluster service account, else KUBECONFIG)."""

    def __init__(self, env: TrainerEnv) -> None:
        from kubernetes import client, config  # the operator extra; present in the trainer image

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            # Named explicitly: the client reads KUBECONFIG once, when it is first imported.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
        self._api = client.CustomObjectsApi()
        self._name, self._namespace = env.run_name, env.run_namespace

    def write(self, progress: TrainerProgress) -> None:
        self._api.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self._namespace,
            TrainingRun.plural,
            self._name,
            status_patch(progress),
        )


class FileStatusWriter:
    """Appends one JSON line per report: the status patch, and the whole progress (phase, stage, message)
    for the local executor and for people reading the file."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, progress: TrainerProgress) -> None:
        line = {**status_patch(progress), "progress": progress.model_dump(mode="json")}
        with self._path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, sort_keys=True) + "\n")


class LogStatusWriter:
    def write(self, progress: TrainerProgress) -> None:
        log.info("progress %s", progress.model_dump_json(exclude_none=True))


def open_status_writer(env: TrainerEnv) -> StatusWriter:
    if env.status_mode == "kubernetes":
        return KubernetesStatusWriter(env)
    if env.status_mode == "file":
        if not env.status_file:
            raise ValueError("status mode 'file' needs CUDA_AGENT_STATUS_FILE")
        return FileStatusWriter(env.status_file)
    return LogStatusWriter()
