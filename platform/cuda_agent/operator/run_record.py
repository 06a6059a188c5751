"""The operator's own record of a TrainingRun's past, kept in the run's annotations (pure).

A pass decides from what the operator observed, never from the run's status: the trainer's ServiceAccount
may patch the whole status subresource (RBAC cannot narrow a patch to fields), so a forged `startTime`
or `phase: Succeeded` read back from the status would steer the operator (a deadline that never fires,
compute removed for good). The few facts a pass needs about earlier passes (when the run was admitted,
since when its compute has not been running, how it ended, the suspension's bookkeeping) are written by
the operator into the run's annotations, which the trainer cannot write (a status write never changes
metadata), and are read back validated: a value that does not parse, a time without a zone or in the
future, counts as absent and is rewritten by the pass. The status only mirrors them for people.

The run's author may edit annotations as they may edit the spec (a deadline is theirs to set): the record
guards against the status writer, not against the run's own author (docs/install.md, "Multi-tenancy").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.operator import labels as lb
from cuda_agent.operator.conditions import Condition, rfc3339, trusted_time

STARTED_AT = "cuda-agent.io/started-at"  # admission: deadlines count from it
WAITING_SINCE = "cuda-agent.io/waiting-since"  # the admitted compute has not run since: the start timeout
ENDED = "cuda-agent.io/ended"  # JSON {"type", "reason", "message"}: how the run ended
SUSPEND_REQUESTED_AT = lb.SUSPEND_REQUESTED_AT  # when spec.suspend was first seen true
CHECKPOINT_BEFORE = "cuda-agent.io/suspend-checkpoint-before"  # the checkpoint that existed then
KEYS = (STARTED_AT, WAITING_SINCE, ENDED, SUSPEND_REQUESTED_AT, CHECKPOINT_BEFORE)
REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,127}")
MAX_MESSAGE = 8000
MAX_CHECKPOINT = 2048


@dataclass(frozen=True)
class RunRecord:
    started_at: datetime | None = None
    waiting_since: datetime | None = None
    ended: Condition | None = None  # Succeeded or Failed, True
    suspend_requested_at: datetime | None = None
    checkpoint_before: str | None = None  # "" : no checkpoint existed when suspension was asked for


def read_record(
    annotations: Mapping[str, str], now: datetime, created: datetime | None
) -> tuple[RunRecord, list[str]]:
    """(the record, a description of each annotation that was not valid and is ignored)."""
    problems: list[str] = []

    def moment(key: str) -> datetime | None:
        text = annotations.get(key)
        if text is None:
            return None
        found = trusted_time(text, now, created)
        if found is None:
            problems.append(
                f"{key}={text[:80]!r} is not an RFC 3339 time with a zone between the run's creation and now"
            )
        return found

    before = annotations.get(CHECKPOINT_BEFORE)
    if before is not None and (len(before) > MAX_CHECKPOINT or not before.isprintable()):
        problems.append(f"{CHECKPOINT_BEFORE} is not a checkpoint URI")
        before = None
    record = RunRecord(
        started_at=moment(STARTED_AT),
        waiting_since=moment(WAITING_SINCE),
        ended=_ended(annotations.get(ENDED), problems),
        suspend_requested_at=moment(SUSPEND_REQUESTED_AT),
        checkpoint_before=before,
    )
    return record, problems


def _ended(text: str | None, problems: list[str]) -> Condition | None:
    if text is None:
        return None
    try:
        found = json.loads(text)
        kind, reason, message = found["type"], found["reason"], found.get("message", "")
        if kind not in (RunCondition.SUCCEEDED, RunCondition.FAILED):
            raise ValueError(f"type {kind!r}")
        if not isinstance(reason, str) or not REASON.fullmatch(reason):
            raise ValueError(f"reason {reason!r}")
        if not isinstance(message, str):
            raise ValueError("message is not a string")
    except (ValueError, KeyError, TypeError) as error:
        # The run ended (only the operator writes this key), but how was lost: it stays ended.
        problems.append(f"{ENDED} is not the operator's record ({error})")
        return Condition(
            RunCondition.FAILED, True, "EndRecordInvalid",
            f"the run ended, but its annotation {ENDED} was changed since and no longer says how",
        )  # fmt: skip
    return Condition(RunCondition(kind), True, reason, message[:MAX_MESSAGE])


def annotations_of(record: RunRecord) -> dict[str, str | None]:
    """The record as annotation values (None: the key is absent)."""
    ended = record.ended
    return {
        STARTED_AT: rfc3339(record.started_at) if record.started_at else None,
        WAITING_SINCE: rfc3339(record.waiting_since) if record.waiting_since else None,
        ENDED: json.dumps(
            {"type": str(ended.type), "reason": ended.reason, "message": ended.message[:MAX_MESSAGE]}
        )
        if ended is not None
        else None,
        SUSPEND_REQUESTED_AT: rfc3339(record.suspend_requested_at) if record.suspend_requested_at else None,
        CHECKPOINT_BEFORE: record.checkpoint_before,
    }


def record_patch(annotations: Mapping[str, str], record: RunRecord) -> dict[str, str | None]:
    """The annotations a merge patch must set (None: remove) so the run carries `record`; an invalid
    value is replaced even when the record's value is absent."""
    wanted = annotations_of(record)
    return {key: value for key, value in wanted.items() if annotations.get(key) != value}
