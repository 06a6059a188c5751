"""One judge verdict: the judge writes `judge.config.JudgeVerdict` (strict) and the server, the client and the
agent loop read it as `sandbox.api.JudgeResult` (loose). The reader must stay a loosened view of the writer:
its fields are the writer's, and everything the writer prints reads back unchanged."""

from __future__ import annotations

import json
import typing

from cuda_agent.api import judge as config
from cuda_agent.api import sandbox as api


def a_full_verdict() -> config.JudgeVerdict:
    """A verdict with every field away from its default, nested ones included."""
    return config.JudgeVerdict(
        reward=3,
        compiled=True,
        correct=True,
        violations=["none-really"],
        error="e",
        timings_ms=config.TimingTriple(candidate=1.0, eager=2.0, compile=3.0),
        speedup=config.Speedups(eager=2.0, compile=3.0),
        cv=config.TimingTriple(candidate=0.01, eager=0.02, compile=None),
        precision="tf32",
        device="cuda",
        build_log="log",
        seconds=config.PhaseSeconds(build=1.0, verify=2.0, profile=3.0),
        timing_method="cuda-events",
        latency_ms=config.TimingTriple(candidate=1.5),
        task_flags=["flag"],
        build_cached=True,
        lock_wait_s=0.5,
        build_lock_wait_s=0.25,
        layout="kernels",
        output_transfer="channel",
        trials=5,
        profile_trials=100,
        seed_id="abc",
        isolation={"judge_dumpable": "false"},
        steps_s={"build": 1.0},
        roofline=config.Roofline(min_bytes=10, enforced=True),
        notes=["a note"],
    )


def test_every_reader_field_is_a_writer_field() -> None:
    assert set(api.JudgeResult.model_fields) <= set(config.JudgeVerdict.model_fields)
    required = {name for name, field in api.JudgeResult.model_fields.items() if field.is_required()}
    assert required == {"reward", "compiled", "correct"}
    assert api.JudgeResult.model_fields["reward"].annotation == config.Reward
    assert set(typing.get_args(config.Reward)) == {-1, 1, 2, 3}


def test_what_the_writer_prints_reads_back_unchanged() -> None:
    for verdict in (config.JudgeVerdict(), a_full_verdict()):
        printed = json.loads(verdict.model_dump_json())
        read = api.JudgeResult.model_validate(printed)
        assert read.model_dump(mode="json") == printed
        assert set(read.model_extra or {}) == set(printed) - set(api.JudgeResult.model_fields)
        # and what the reader passes on (the HTTP body of a judge run) is the writer's model again
        again = config.JudgeVerdict.model_validate(read.model_dump(mode="json"))
        assert again == verdict
