"""A stand-in for `cuda-agent train -f run.yaml`, used by test_local_executor.py until the real trainer
lands (and afterwards to keep that test cheap): it takes what the operator's local executor gives a
trainer (the run file, the TrainerEnv environment, KUBECONFIG with the trainer ServiceAccount's token,
the artifacts Secret as environment) and reports progress the way the trainer does, by patching its
TrainingRun's status through the API models. It trains nothing.

Behaviour by run name (the operator starts every run with the same command): `crash-*` exits 3 at once;
`finish-*` reports three steps and exits 0; anything else reports three steps and then waits, watching
`spec.suspend` as the trainer does: on suspension it reports a checkpoint and exits 0.
Like the trainer's entry point it sets telemetry up from its environment (so it serves /metrics on the
port the operator handed over, CUDA_AGENT_METRICS_PORT) and records each step in the trainer's families.
It writes its pid to `standin.pid` and its environment to `standin.env.json` next to run.yaml so the
test can see the process end and what it was given; it opens and closes one session on the run's sandbox
server with the episode settings it was handed (the real trainer's rollout asks for the same) and writes
them, with the device the server gave the session, to `episode.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingMetrics, TrainingRunStatus
from cuda_agent.sandbox.client import SyncSandboxClient
from cuda_agent.telemetry import configure_telemetry, record_step

TASK = """import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
"""


def run_path(env: TrainerEnv) -> tuple[str, str, str, str, str]:
    return ("cuda-agent.io", "v1alpha1", env.run_namespace, "trainingruns", env.run_name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-f", dest="run_file", type=Path, required=True)
    args = parser.parse_args()
    env = TrainerEnv.from_environ(os.environ)
    configure_telemetry(service_name="cuda-agent-trainer")  # as cuda_agent.trainer.cli.main does
    run = yaml.safe_load(args.run_file.read_text())
    (args.run_file.parent / "standin.pid").write_text(str(os.getpid()))
    (args.run_file.parent / "standin.env.json").write_text(json.dumps(dict(os.environ)))
    assert run["metadata"]["name"] == env.run_name and env.status_mode == "kubernetes"
    assert os.environ.get("AWS_ACCESS_KEY_ID"), "the artifacts Secret is not in the environment"
    if env.run_name.startswith("crash-"):
        print("stand-in trainer: crashing on purpose", flush=True)
        return 3
    assert env.sandbox_url is not None
    with urllib.request.urlopen(f"{env.sandbox_url}/v1/status", timeout=10) as answer:
        assert answer.status == 200, "the local sandbox server does not answer"
    # A session with the episode settings the operator handed over, as the real trainer's rollout opens
    # them: the local server must accept the device they name (what it judges on).
    assert env.episode is not None, "the operator handed over no episode settings"
    sandbox = SyncSandboxClient(env.sandbox_url, timeout_s=60)
    session = sandbox.create_session(TASK, device=env.episode.device, judge=env.episode.judge)
    sandbox.delete_session(session.session_id)
    (args.run_file.parent / "episode.json").write_text(
        json.dumps({"episode": env.episode.model_dump(mode="json"), "session_device": session.device})
    )
    config.load_kube_config()  # type: ignore[no-untyped-call]
    api = client.CustomObjectsApi()
    for step in (1, 2, 3):
        status = TrainingRunStatus(
            step=step, metrics=TrainingMetrics(mean_reward=-1.0 + step, pass_rate=step / 4)
        ).model_dump(by_alias=True, exclude_none=True, exclude={"conditions"}, mode="json")
        api.patch_namespaced_custom_object_status(*run_path(env), {"status": status})
        record_step("ppo", step, {"reward": -1.0 + step, "pass_rate": step / 4})
        print(f"stand-in trainer: step {step}", flush=True)
        time.sleep(0.3)
    if env.run_name.startswith("finish-"):
        return 0
    while True:  # like the trainer: watch spec.suspend; on suspension report a checkpoint and exit 0
        run_now = cast(dict[str, Any], api.get_namespaced_custom_object(*run_path(env)))
        if run_now.get("spec", {}).get("suspend"):
            checkpoint = f"{env.checkpoint_prefix}/step-3"
            status = TrainingRunStatus(last_checkpoint=checkpoint).model_dump(
                by_alias=True, exclude_none=True, exclude={"conditions"}, mode="json"
            )
            api.patch_namespaced_custom_object_status(
                "cuda-agent.io",
                "v1alpha1",
                env.run_namespace,
                "trainingruns",
                env.run_name,
                {"status": status},
            )
            print(f"stand-in trainer: suspended at {checkpoint}", flush=True)
            return 0
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
