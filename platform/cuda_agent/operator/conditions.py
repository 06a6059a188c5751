"""Kubernetes-style status conditions, computed as pure data.

A reconcile pass decides every condition it owns from scratch; `merge_conditions` keeps the previous
`lastTransitionTime` when a condition's status did not change, so `kubectl wait` and dashboards see
real transitions rather than a timestamp that moves on every pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cuda_agent.api.base import Condition as ConditionModel
from cuda_agent.api.base import ConditionStatus
from cuda_agent.api.sandboxpool import SandboxPoolConditionType
from cuda_agent.api.trainingrun import TrainingRunConditionType

ConditionType = SandboxPoolConditionType | TrainingRunConditionType
SKEW_SECONDS = 60  # how far another machine's clock may run ahead of the operator's


@dataclass(frozen=True)
class Condition:
    """One condition as decided by a reconcile pass; `reason` is CamelCase, `message` is for people."""

    type: ConditionType
    status: bool | None  # None: Unknown (the operator could not find out)
    reason: str
    message: str = ""


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> datetime | None:
    """An RFC 3339 time with its zone, else None: annotations are written by people and other tools
    too, and a time without a zone cannot be compared with the operator's (aware) clock."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def trusted_time(text: object, now: datetime, not_before: datetime | None = None) -> datetime | None:
    """A recorded moment the operator may act on: RFC 3339 with a zone, not in the future (a clock
    skew of SKEW_SECONDS aside) and not before `not_before` (say, the object's creation); else None."""
    moment = parse_rfc3339(text)
    if moment is None or moment > now + timedelta(seconds=SKEW_SECONDS):
        return None
    if not_before is not None and moment < not_before - timedelta(seconds=SKEW_SECONDS):
        return None
    return min(moment, now)


def merge_conditions(
    existing: Sequence[Mapping[str, Any]] | None,
    decided: Iterable[Condition],
    *,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """The new `status.conditions` list: decided conditions first, then the resource's other condition
    types as they were. Types the operator does not own are dropped: the status allows 16 conditions,
    and anyone who may write it (a trainer's ServiceAccount) could otherwise fill it so that every
    write of the operator's own conditions is refused."""
    decided = list(decided)
    owned = {str(kind) for condition in decided for kind in type(condition.type)}
    previous = {
        str(item.get("type")): item
        for item in existing or ()
        if isinstance(item, Mapping) and str(item.get("type")) in owned
    }
    merged: list[dict[str, Any]] = []
    seen: set[str] = set()
    for condition in decided:
        status = (
            ConditionStatus.UNKNOWN
            if condition.status is None
            else ConditionStatus.TRUE
            if condition.status
            else ConditionStatus.FALSE
        )
        before = previous.get(condition.type)
        kept = trusted_time(before.get("lastTransitionTime"), now) if before is not None else None
        changed = before is None or before.get("status") != status
        moment = kept if kept is not None and not changed else now.astimezone(UTC).replace(microsecond=0)
        model = ConditionModel(
            type=condition.type,
            status=status,
            reason=condition.reason,
            message=condition.message,
            observed_generation=generation,
            last_transition_time=moment,
        )
        merged.append(model.model_dump(by_alias=True, exclude_none=True, mode="json"))
        seen.add(condition.type)
    merged += [dict(item) for kind, item in previous.items() if kind not in seen]
    return merged


def find(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((item for item in conditions or () if item.get("type") == kind), None)


def is_true(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> bool:
    found = find(conditions, kind)
    return found is not None and found.get("status") == "True"
