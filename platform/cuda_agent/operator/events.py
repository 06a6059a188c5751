"""What a reconcile pass tells people: Kubernetes Events for transitions, one log line per change.

Events are derived from the status a pass writes, compared with the one before it, so every transition
is told once (a pass that changes nothing posts nothing), and they go through kube.py like every write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.kube import KubeError, Manifest
from cuda_agent.telemetry.logs import log_fields

log = logging.getLogger("cuda_agent.operator.reconcile")


@dataclass(frozen=True)
class Event:
    warning: bool
    reason: str
    message: str
    condition: str = ""  # the condition type whose transition this tells ("" for other Events)


def condition_events(
    previous: Mapping[str, Any],
    status: Mapping[str, Any],
    is_problem: Callable[[Mapping[str, Any]], bool],
    *,
    also: str | None = None,
) -> list[Event]:
    """Exactly one Event per condition transition (pure): for each condition whose status or reason
    differs from `previous`, reason = its new reason, Warning when it is a problem. A condition written
    for the first time is a transition when it is True or a problem; one first written False/Unknown and
    harmless ("NotSucceeded") is no news. `also` names a condition type told even when it did not change
    (the one behind a new phase). Conditions that did not change give nothing, so a write that changed
    only messages or counts, or a pass that wrote nothing, posts nothing."""
    before = {c.get("type"): c for c in previous.get("conditions") or ()}
    events = []
    for condition in status.get("conditions") or ():
        kind = str(condition.get("type"))
        old = before.get(kind)
        now = (condition.get("status"), condition.get("reason"))
        problem = is_problem(condition)
        if old is None:
            told = condition.get("status") == "True" or problem
        else:
            told = (old.get("status"), old.get("reason")) != now
        if told or kind == also:
            message = f"{kind}={condition['status']}: {condition.get('message') or ''}"
            events.append(Event(problem, str(condition["reason"]), message, kind))
    return events


def changed_fields(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The operator-owned status fields a write changes, conditions as type=status/reason (pure)."""
    changes: dict[str, Any] = {}
    for field, value in status.items():
        if field == "conditions":
            old = {(c.get("type"), c.get("status"), c.get("reason")) for c in previous.get(field) or ()}
            moved = [f"{c['type']}={c['status']}/{c['reason']}" for c in value if
                     (c.get("type"), c.get("status"), c.get("reason")) not in old]  # fmt: skip
            if moved:
                changes[field] = moved
        elif previous.get(field) != value:
            changes[field] = value
    return changes


async def post(context: OperatorContext, involved: Manifest, events: Sequence[Event]) -> None:
    """Post Events on the object; a failure is logged, never fails the pass (the status holds the truth)."""
    for event in events:
        try:
            await context.kube.post_event(
                involved, warning=event.warning, reason=event.reason, message=event.message
            )
        except KubeError as error:
            log.warning("event %s on %s not posted: %s", event.reason, involved["metadata"]["name"], error)


def log_pass(kind: str, namespace: str, name: str, **changes: Any) -> None:
    """One log line for a pass that changed something, its changes as fields of the line (JSON keys)
    and the object as `k8s_ref`, the field Kopf's own lines name their object with; quiet passes log
    nothing."""
    changed = {key: value for key, value in changes.items() if value}
    if changed:
        ref = {"kind": kind, "namespace": namespace, "name": name}
        log.info("reconciled %s %s/%s", kind, namespace, name, extra=log_fields({"k8s_ref": ref, **changed}))
