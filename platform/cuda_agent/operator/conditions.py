"""Kubernetes-style status conditions, computed as pure data.

A reconcile pass decides every condition it owns from scratch; `merge_conditions` keeps the previous
`lastTransitionTime` when a condition's status did not change, so `kubectl wait` and dashboards see
real transitions rather than a timestamp that moves on every pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cuda_agent.api.base import Condition as ConditionModel
from cuda_agent.api.base import ConditionStatus
from cuda_agent.api.sandboxpool import SandboxPoolConditionType
from cuda_agent.api.trainingrun import TrainingRunConditionType

ConditionType = SandboxPoolConditionType | TrainingRunConditionType


@dataclass(frozen=True)
class Condition:
    """One condition as decided by a reconcile pass; `reason` is CamelCase, `message` is for people."""

    type: ConditionType
    status: bool | None  # None: Unknown (the operator could not find out)
    reason: str
    message: str = ""


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def merge_conditions(
    existing: Sequence[Mapping[str, Any]] | None,
    decided: Iterable[Condition],
    *,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """The new `status.conditions` list: decided conditions first, then unknown types kept as they were."""
    previous = {str(item.get("type")): item for item in existing or ()}
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
        kept = parse_rfc3339(before.get("lastTransitionTime")) if before is not None else None
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
