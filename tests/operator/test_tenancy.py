"""What a namespace's runs may reach (operator/tenancy.py) and the operator's record of a run
(operator/run_record.py), as pure functions; test_tenancy_cluster.py shows them on the real apiserver."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.drain import plan_drain
from cuda_agent.operator.run_record import (
    CHECKPOINT_BEFORE,
    ENDED,
    STARTED_AT,
    WAITING_SINCE,
    RunRecord,
    annotations_of,
    read_record,
    record_patch,
)
from cuda_agent.operator.tenancy import (
    ARTIFACTS_ENV_NAMES,
    default_checkpoint_prefix,
    namespace_root,
    resume_point,
    valid_image,
    within,
)
from cuda_agent.operator.views import PodView

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CREATED = NOW - timedelta(hours=1)


def test_images_are_references_without_whitespace() -> None:
    assert valid_image("ghcr.io/cuda-agent/trainer:0.1.0")
    assert valid_image("registry.example:5000/team/trainer@sha256:" + "0" * 64)
    assert not valid_image("ghcr.io/cuda-agent/trainer:0.1.0\nevil")
    assert not valid_image("ghcr.io/x y") and not valid_image("") and not valid_image("UPPER/case")
    with pytest.raises(ValueError, match="allowed-trainer-image"):
        OperatorConfig(allowed_trainer_images=("ok.io/a:1", "bad image"))
    with pytest.raises(ValueError, match="trainer-image"):
        OperatorConfig(trainer_image="a\nb")


def test_a_namespace_reaches_only_its_own_prefix() -> None:
    root = namespace_root("cuda-agent", "team-a")
    assert root == "s3://cuda-agent/team-a/"
    assert default_checkpoint_prefix("cuda-agent", "team-a", "run", "u1") == (
        "s3://cuda-agent/team-a/run/u1/checkpoints"
    )
    assert within("s3://cuda-agent/team-a/exp/1", root)
    assert within("s3://cuda-agent/team-a/exp/", root)
    for outside in (
        "s3://cuda-agent/team-b/run",  # another namespace
        "s3://cuda-agent/team-a",  # the root itself, without a key under it
        "s3://cuda-agent/team-a/",
        "s3://cuda-agent/team-ab/run",  # a namespace whose name starts with this one's
        "s3://cuda-agent/team-a/../team-b/run",
        "s3://cuda-agent/team-a//run",
        "s3://cuda-agent/team-a/./run",
        "s3://cuda-agent/team-a/run\\x",
        "s3://cuda-agent/team-a/run\nx",
        "s3://other-bucket/team-a/run",
    ):
        assert not within(outside, root), outside


def test_only_a_checkpoint_under_the_runs_own_prefix_is_a_resume_point() -> None:
    prefix = "s3://cuda-agent/team-a/run/u1/checkpoints"
    assert resume_point(f"{prefix}/ckpt-000004", prefix) == f"{prefix}/ckpt-000004"
    assert resume_point("s3://cuda-agent/team-b/run/u9/checkpoints/ckpt-000001", prefix) is None
    assert (
        resume_point("s3://cuda-agent/team-a/run/u0/checkpoints/ckpt-000001", prefix) is None
    )  # predecessor
    assert resume_point(prefix, prefix) is None and resume_point(None, prefix) is None
    assert resume_point(42, prefix) is None


def test_only_storage_settings_of_the_artifacts_secret_reach_a_trainer() -> None:
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} <= set(
        ARTIFACTS_ENV_NAMES
    )
    for name in ("PYTHONWARNINGS", "BROWSER", "LD_PRELOAD", "PATH", "CUDA_AGENT_PVC_ROOT", "KUBECONFIG"):
        assert name not in ARTIFACTS_ENV_NAMES


def test_the_record_round_trips_and_only_changes_are_patched() -> None:
    record = RunRecord(
        started_at=NOW - timedelta(minutes=5),
        waiting_since=NOW - timedelta(minutes=1),
        suspend_requested_at=NOW,
        checkpoint_before="",
    )
    annotations = {k: v for k, v in annotations_of(record).items() if v is not None}
    again, problems = read_record(annotations, NOW, CREATED)
    assert again == record and problems == []
    assert record_patch(annotations, again) == {}
    removed = [STARTED_AT, WAITING_SINCE, "cuda-agent.io/suspend-requested-at", CHECKPOINT_BEFORE]
    assert record_patch(annotations, RunRecord()) == dict.fromkeys(removed)


def test_invalid_record_values_are_ignored_and_rewritten() -> None:
    annotations = {
        STARTED_AT: "2026-12-02T11:00:00",  # no zone (a naive time crashed the comparison)
        WAITING_SINCE: "2099-01-01T00:00:00Z",  # in the future: a deadline that never fires
        "cuda-agent.io/suspend-requested-at": "2020-01-01T00:00:00Z",  # before the run existed
    }
    record, problems = read_record(annotations, NOW, CREATED)
    assert record == RunRecord() and len(problems) == 3
    assert set(record_patch(annotations, record)) == set(annotations)  # each is removed (or rewritten)


def test_an_end_record_that_was_tampered_with_still_ends_the_run() -> None:
    ended = {"type": "Failed", "reason": "DeadlineExceeded", "message": "held 90 s"}
    record, problems = read_record({ENDED: json.dumps(ended)}, NOW, CREATED)
    assert record.ended is not None and record.ended.reason == "DeadlineExceeded" and problems == []
    for garbage in ("{", json.dumps({**ended, "type": "Running"}), json.dumps({**ended, "reason": "a b"})):
        record, problems = read_record({ENDED: garbage}, NOW, CREATED)
        assert record.ended is not None and record.ended.reason == "EndRecordInvalid" and problems


def test_a_drain_mark_without_a_zone_is_a_clock_that_has_not_started() -> None:
    def pod(name: str, drain_since: str | None) -> PodView:
        return PodView(name, "Running", True, None, None, drain_since, False, ())

    pods = [pod("pool-0", None), pod("pool-1", "2026-12-02T11:00:00"), pod("pool-2", "2099-01-01T00:00:00Z")]
    plan = plan_drain(1, 3, pods, {}, NOW, grace=600)
    # Both marks are rewritten (the grace clock starts now); neither pod counts as drained.
    assert plan.start_draining == ("pool-2", "pool-1") and plan.statefulset_replicas == 3
