"""The orchestrator <-> worker messages (judge/protocol.py): TypedDicts that mypy checks on both ends, free at
run time, so the worker still loads no pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

from cuda_agent.sandbox.judge import protocol


def test_the_worker_loads_no_pydantic() -> None:
    code = "import sys, cuda_agent.sandbox.judge.worker; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_message_kind_has_its_own_type_tag() -> None:
    kinds = typing.get_args(protocol.Message)
    tags = [typing.get_args(typing.get_type_hints(kind)["type"])[0] for kind in kinds]
    assert len(tags) == len(set(tags)) == 19
    assert "config" in tags and "profile_result" in tags and "judge_error" in tags


def test_messages_are_plain_json_objects() -> None:
    trial: protocol.TrialCommand = {
        "type": "trial",
        "index": 1,
        "order": "model-first",
        "seed": 7,
        "variant": "task",
        "refill_seed": 8,
        "refill_variant": "task",
        "structure": None,
        "meta": [],
        "output_bytes": [16],
        "task_mutates_inputs": False,
    }
    assert type(trial) is dict and json.loads(json.dumps(trial)) == trial
