"""Linked files (issue #40 item 3): a profile names what must move with a quota.

```yaml
linked:
  variables:          # a file another script compares with the live queues
    - path: verify/quotas.env
      values:
        RESEARCH_TRAIN_GPU: {queue: research-train-h100, resource: gpu, field: guarantee}
  resourceQuotas:     # a ResourceQuota that mirrors a queue's limit in whole cards
    - {queue: research-train-h100, namespace: research-train, name: gpu,
       key: requests.nvidia.com/gpu}
  reminders:          # files a person updates by hand
    - {path: docs/runbook.md, note: the GPU table}
```

The ResourceQuotas join the target (their patches are planned like any other object's);
variables are rewritten in git mode (the bytes of the value only, in ``KEY=VALUE`` or
``KEY: VALUE`` lines) and listed otherwise; reminders are listed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from app.quotaview.plan import GUARANTEE, Key, key_of

__all__ = ["Linked", "Profile", "ProfileError", "link", "load_profile", "rewrite_variables"]


class ProfileError(ValueError):
    """A profile that does not parse or does not have the shape above."""


@dataclass
class Linked:
    kind: str
    """variable, resourceQuota or reminder."""
    where: str
    key: str = ""
    before: str | None = None
    after: str | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "where": self.where, "key": self.key, "before": self.before,
                "after": self.after, "note": self.note}


@dataclass
class Profile:
    variables: list[dict[str, Any]] = field(default_factory=list)
    resource_quotas: list[dict[str, Any]] = field(default_factory=list)
    reminders: list[dict[str, Any]] = field(default_factory=list)


def load_profile(text: str, source: str) -> Profile:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc
    linked = doc.get("linked") if isinstance(doc, dict) else None
    if not isinstance(linked, dict):
        raise ProfileError(f"{source}: expected a mapping with `linked:`")
    out = Profile()
    for name, attr, needs in (("variables", "variables", ("path", "values")),
                              ("resourceQuotas", "resource_quotas", ("queue", "namespace", "name", "key")),
                              ("reminders", "reminders", ("path",))):
        items = linked.get(name) or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ProfileError(f"{source}: linked.{name} is a list of mappings")
        for i, item in enumerate(items):
            missing = [k for k in needs if k not in item]
            if missing:
                raise ProfileError(f"{source}: linked.{name}[{i}] needs {', '.join(missing)}")
        setattr(out, attr, items)
    for i, item in enumerate(out.variables):
        if not isinstance(item["values"], dict) or not all(
                isinstance(v, dict) and "queue" in v for v in item["values"].values()):
            raise ProfileError(f"{source}: linked.variables[{i}].values maps names to "
                               f"{{queue, resource, field}}")
    return out


def queue_values(objects: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Queue name -> resource -> {guarantee, limit, overQuotaWeight} as written."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind not in GUARANTEE or key_of(obj) is None:
            continue
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        if kind == "Queue":
            entries = [((obj.get("metadata") or {}).get("name"), spec)]
        else:
            entries = [(e.get("name"), e) for e in spec.get("queues") or [] if isinstance(e, dict)]
        for name, entry in entries:
            resources = entry.get("resources") if isinstance(entry.get("resources"), dict) else {}
            out[str(name)] = {r: {"guarantee": b.get(GUARANTEE[str(kind)]), "limit": b.get("limit"),
                                  "overQuotaWeight": b.get("overQuotaWeight")}
                              for r, b in (resources or {}).items() if isinstance(b, dict)}
    return out


def _value(values: dict[str, dict[str, dict[str, Any]]], ref: dict[str, Any]) -> Any:
    return values.get(str(ref.get("queue")), {}).get(str(ref.get("resource", "gpu")), {}).get(
        str(ref.get("field", "guarantee")))


def _whole_cards(limit: Any) -> str | None:
    try:
        value = Decimal(str(limit))
    except InvalidOperation:
        return None
    return None if value < 0 else str(int(value))


def link(profile: Profile, base: list[dict[str, Any]], target: list[dict[str, Any]]
         ) -> tuple[list[dict[str, Any]], list[Linked]]:
    """The target with the mirrored ResourceQuotas set, and every linked item."""
    before, after = queue_values(base), queue_values(target)
    items: list[Linked] = []
    out = list(target)
    index: dict[Key, int] = {k: i for i, o in enumerate(out) if (k := key_of(o)) is not None}
    for rq in profile.resource_quotas:
        key: Key = ("ResourceQuota", str(rq["namespace"]), str(rq["name"]))
        want = _whole_cards(_value(after, {"queue": rq["queue"], "resource": "gpu", "field": "limit"}))
        where = f"ResourceQuota {rq['namespace']}/{rq['name']}"
        at = index.get(key)
        if at is None:
            items.append(Linked("resourceQuota", where, str(rq["key"]), note="not found in the base"))
            continue
        obj = out[at]
        hard = dict((obj.get("spec") or {}).get("hard") or {})
        old = hard.get(str(rq["key"]))
        if want is not None and old != want:
            hard[str(rq["key"])] = want
            out[at] = {**obj, "spec": {**(obj.get("spec") or {}), "hard": hard}}
        items.append(Linked("resourceQuota", where, str(rq["key"]), None if old is None else str(old),
                            want, note="mirrors the queue's gpu limit in whole cards"
                            if want is not None else "the limit is unlimited; left as it is"))
    for var in profile.variables:
        for name, ref in var["values"].items():
            old_value, new_value = _value(before, ref), _value(after, ref)
            if old_value != new_value:
                items.append(Linked("variable", str(var["path"]), str(name), _text(old_value),
                                    _text(new_value)))
    for reminder in profile.reminders:
        items.append(Linked("reminder", str(reminder["path"]), note=str(reminder.get("note", ""))))
    return out, items


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def rewrite_variables(text: str, changes: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with the value of each ``KEY=VALUE`` / ``KEY: VALUE`` line named in
    ``changes`` replaced (its bytes only: quotes, padding and a trailing comment kept);
    and the keys not found."""
    missing = []
    for key, value in changes.items():
        pattern = re.compile(rf"^(\s*(?:export\s+)?{re.escape(key)}\s*[=:]\s*)([\"']?)([^\"'\s#]*)(\2)",
                             re.MULTILINE)
        def swap(m: re.Match[str], new: str = value) -> str:
            return f"{m.group(1)}{m.group(2)}{new}{m.group(4)}"

        text, count = pattern.subn(swap, text, count=1)
        if not count:
            missing.append(key)
    return text, missing
