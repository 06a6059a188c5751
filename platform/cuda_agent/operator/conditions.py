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


@dataclass(frozen=True)
class Condition:
    """One condition as decided by a reconcile pass; `reason` is CamelCase, `message` is for people."""

    type: str
    status: bool
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
        status = "True" if condition.status else "False"
        before = previous.get(condition.type)
        changed = before is None or before.get("status") != status
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "observedGeneration": generation,
                "lastTransitionTime": rfc3339(now)
                if changed or before is None
                else before.get("lastTransitionTime", rfc3339(now)),
            }
        )
        seen.add(condition.type)
    merged += [dict(item) for kind, item in previous.items() if kind not in seen]
    return merged


def find(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((item for item in conditions or () if item.get("type") == kind), None)


def is_true(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> bool:
    found = find(conditions, kind)
    return found is not None and found.get("status") == "True"
