"""When a run must end: deadline, start timeout (with the stuck pod's reason; also for a started run
whose compute stops running and cannot come back), a finished trainer past its deadline. The times come
from the operator's record, never from the status. `decide_failure` reads the executor only for a failed
trainer's log, so these cases pass a bare context object (no apiserver is involved in the decision)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator.compute import Compute
from cuda_agent.operator.conditions import Condition
from cuda_agent.operator.run_children import RunContext
from cuda_agent.operator.run_reconciler import decide_failure, timed
from cuda_agent.operator.run_record import RunRecord

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RUN = RunContext("run", "team", "uid", "img", "artifacts", "s3://b/p", None, None)
SPEC = TrainingRunSpec.model_validate(
    {
        "model": {"base": "s3://models/m"},
        "dataset": {"uri": "s3://data/d"},
        "sandboxPoolRef": {"name": "pool"},
        "runPolicy": {"activeDeadlineSeconds": 3600, "startTimeoutSeconds": 600},
    }
)


def failure(compute: Compute, started_ago: float, waiting_ago: float | None = None) -> Condition | None:
    """`waiting_ago`: since when the record says the compute has not been running (None: it runs);
    by default since the admission (it never ran)."""
    waiting = (
        started_ago
        if waiting_ago is None and not (compute.ready and compute.driver == "active")
        else waiting_ago
    )
    record = RunRecord(
        started_at=NOW - timedelta(seconds=started_ago),
        waiting_since=NOW - timedelta(seconds=waiting) if waiting is not None else None,
    )
    context: Any = SimpleNamespace()
    return asyncio.run(decide_failure(context, RUN, SPEC, compute, record, "s3://b/p/step-4", NOW))


def compute(ready: bool, driver: str, stuck: tuple[str, str] | None = None) -> Compute:
    return Compute(True, ready, "1/2 Ray pods ready", driver, "driver pod starting", stuck=stuck)  # type: ignore[arg-type]


def test_deadline_ends_a_running_run_and_names_its_last_checkpoint() -> None:
    assert failure(compute(True, "active"), 3599) is None
    ended = failure(compute(True, "active"), 3600)
    assert ended is not None and ended.reason == "DeadlineExceeded"
    assert "activeDeadlineSeconds=3600" in ended.message and "step-4" in ended.message


def test_a_start_that_never_comes_ends_with_the_stuck_pods_reason() -> None:
    assert failure(compute(False, "absent"), 599) is None
    stuck = ("Unschedulable", "pod run-ray-worker-0: 0/16 nodes are available")
    ended = failure(compute(False, "absent", stuck), 600)
    assert ended is not None and ended.reason == "Unschedulable" and "0/16 nodes" in ended.message
    plain = failure(compute(False, "absent"), 600)
    assert plain is not None and plain.reason == "StartTimeout" and "1/2 Ray pods" in plain.message
    assert failure(compute(True, "active"), 900) is None  # it started: no start timeout


def test_a_started_run_whose_compute_cannot_come_back_times_out_too() -> None:
    stuck = ("Unschedulable", "pod run-ray-worker-0: 0/16 nodes are available")
    # Ran for 1000 s, then a worker pod was recreated and cannot be placed: 599 s of waiting are fine.
    assert failure(compute(False, "active", stuck), 1599, waiting_ago=599) is None
    ended = failure(compute(False, "active", stuck), 1600, waiting_ago=600)
    assert ended is not None and ended.reason == "Unschedulable"
    assert "not running again since" in ended.message and "startTimeoutSeconds=600" in ended.message


def test_without_the_operators_record_of_an_admission_nothing_is_timed() -> None:
    context: Any = SimpleNamespace()
    waiting = compute(False, "absent")
    assert asyncio.run(decide_failure(context, RUN, SPEC, waiting, RunRecord(), "", NOW)) is None


def test_a_finished_trainer_succeeds_even_past_its_deadline() -> None:
    assert failure(compute(True, "complete"), 7200) is None


def test_the_record_times_a_run_from_its_admission_and_its_compute_from_when_it_stopped() -> None:
    earlier = NOW - timedelta(minutes=30)
    fresh = timed(RunRecord(), holds=True, fresh=True, since=earlier, running=False, now=NOW)
    assert fresh == RunRecord(started_at=NOW, waiting_since=NOW)  # admitted now, not running yet
    running = timed(fresh, holds=True, fresh=True, since=earlier, running=True, now=NOW)
    assert running == RunRecord(started_at=NOW)
    later = NOW + timedelta(minutes=5)
    stalled = timed(running, holds=True, fresh=False, since=earlier, running=False, now=later)
    assert stalled == RunRecord(started_at=NOW, waiting_since=later)  # the deadline keeps counting
    # Compute found without a record: from its oldest part's creation, not from now.
    found = timed(RunRecord(), holds=True, fresh=False, since=earlier, running=True, now=NOW)
    assert found == RunRecord(started_at=earlier)
    # Queued, suspended or ended: nothing is timed.
    assert timed(stalled, holds=False, fresh=False, since=None, running=False, now=later) == RunRecord()
