"""Queue names are cluster-wide: one Department, Project or unmanaged KAI Queue each."""

from __future__ import annotations

from typing import Any

from app.rules.base import Finding, Subject
from app.rules.quotas.messages import quota_error
from app.rules.quotas.objects import QUEUE_NAME, After, krm_owned, name_of
from app.rules.quotas.tree import old_slots, slots


def claimed_by(after: After, name: str, mine: dict[str, Any] | None) -> str | None:
    """Who else holds a queue name: a Department, a Project or a KAI Queue KRM does not own."""
    for kind in ("Department", "Project"):
        for other in after.by_index(QUEUE_NAME[kind], name):
            if other is not mine:
                return f"{kind.lower()} {name_of(other)}"
    if after.kind != "Queue":
        queue = after.get("Queue", name)
        if queue is not None and not krm_owned(queue, after):
            return "a KAI Queue that KRM does not manage"
    return None


def krm_queue_names(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots(subject.kind, obj)
    if mine is None:
        return []
    had = {s.queue for s in old_slots(subject) or []}
    first: dict[str, str] = {}
    findings = []
    for slot in mine:
        path = f"{slot.path}.name"
        if slot.queue in first:
            findings.append(quota_error(path,
                                    f"{slot.where}: queue name {slot.queue} is used twice in this "
                                    f"{subject.kind} (also {first[slot.queue]}); queue names are "
                                    f"cluster-wide"))
            continue
        first[slot.queue] = slot.path
        other = None if slot.queue in had else claimed_by(after, slot.queue, obj)
        if other:
            findings.append(quota_error(path,
                f"{slot.where}: queue name {slot.queue} is already used by {other}; queue names "
                f"are cluster-wide and KRM would silently rename this queue. Pick another name"))
    return findings
