"""The trainer's Prometheus families scraped from a running `cuda-agent train -f` process.

The trainer gets its metrics port the way the operator hands it over (TrainerEnv -> CUDA_AGENT_METRICS_PORT,
the same `to_environ()` the driver pod's env and the local executor use) and the test reads /metrics over
HTTP while the process trains, parsed with prometheus_client's own parser. The rollout is the scripted one
of the other trainer tests (tests/trainer/scripted_rollout.py: no sandbox, no agent loop), so the agent
loop's episode families stay at their start values; the trainer's step families are the ones under test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.localhost import free_port

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_a_running_trainer_serves_its_step_metrics(
    run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    spec = {
        "dataset": {"uri": str(TASKS)},
        "algorithm": {"steps": 40},  # far more than the test waits for: it is scraped while it trains
        "warmup": {
            "singleTurnPpo": {"enabled": False, "maxContextTokens": 1024},
            "rft": {"enabled": False},
            "valuePretraining": {"enabled": False},
        },
        "agent": {"maxContextTokens": 1024},
    }
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(run_document(**spec)))
    port = free_port()
    contract = TrainerEnv(
        run_name="tiny",
        checkpoint_prefix=str(tmp_path / "ckpt"),
        status_mode="file",
        status_file=str(tmp_path / "status.jsonl"),
        metrics_port=port,
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("CUDA_AGENT_")}
    env |= contract.to_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "cuda_agent.cli", "train", "-f", str(run_file)]
    command += ["--rollout", "scripted_rollout:factory"]
    log = (tmp_path / "trainer.log").open("w")
    trainer = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        stage = (("stage", "ppo"),)
        deadline = time.monotonic() + 300
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        while time.monotonic() < deadline:
            assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            try:
                samples = _scrape(port)
            except OSError:  # not listening yet: the process is still importing torch
                time.sleep(0.5)
                continue
            if samples.get("cuda_agent_trainer_step", {}).get(stage, 0) >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no second PPO step on /metrics in 300 s: {sorted(samples)}")
        assert trainer.poll() is None  # scraped from the running process, not after the run
        for name in ("reward", "pass_rate", "clip_fraction", "approx_kl", "entropy", "explained_variance"):
            value = samples[f"cuda_agent_trainer_{name}"][stage]
            assert math.isfinite(value), (name, value)
        assert -1.0 <= samples["cuda_agent_trainer_reward"][stage] <= 3.0  # a mean of milestone rewards
        assert 0.0 <= samples["cuda_agent_trainer_pass_rate"][stage] <= 1.0
        assert samples["cuda_agent_trainer_weight_sync_seconds_count"][()] >= 2
        assert "process_cpu_seconds_total" in samples  # the process's own collectors, as any exporter
        # Each process serves its own families: nothing of the operator's or a sandbox server's here.
        assert not [n for n in samples if n.startswith(("cuda_agent_operator_", "cuda_agent_sandbox_"))]
    finally:
        trainer.kill()
        trainer.wait(timeout=60)
        log.close()
    # The step's log line carries its metrics as JSON fields, not as text in the message.
    output = (tmp_path / "trainer.log").read_text().splitlines()
    lines = [json.loads(line) for line in output if line[:1] == "{"]
    steps = [line for line in lines if line.get("logger") == "cuda_agent.trainer.driver" and "step" in line]
    assert steps, "no step line in the trainer's log"
    first = steps[0]
    assert first["message"] == "ppo step 1 done" and (first["stage"], first["step"]) == ("ppo", 1)
    for name in ("reward", "pass_rate", "clip_fraction", "approx_kl", "rollout_s"):
        assert isinstance(first[name], float) and math.isfinite(first[name]), (name, first)
