"""A plan's steps as the commands that land them: ``kubectl patch --type=json`` whose
every ``replace`` (and ``remove``) is preceded by a ``test`` of the value the plan read,
so a concurrent change makes the patch fail (422, "test operation failed") instead of
being overwritten; ``kubectl create`` for a new object (fails when one exists);
``kubectl delete`` for one the target leaves out.

JSON Patch ``test`` is RFC 6902 §4.6; the API server applies a ``--type=json`` patch with
evanphx/json-patch (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go,
``jsonPatcher``), which fails the whole patch on a failed test.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import orjson

from app.k8s.kinds import by_ref
from app.quotaview.plan import Step

__all__ = ["Command", "command_of", "patch_ops", "resource_of"]


def _escape(token: object) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def resource_of(kind: str, api_version: str) -> str:
    """kubectl's fully qualified resource (``projects.kai.resources``, ``resourcequotas``)."""
    group = api_version.rpartition("/")[0]
    found = by_ref(group, kind)
    plural = found.resource if found is not None else f"{kind.lower()}s"
    return f"{plural}.{group}" if group else plural


def _identity(value: Any) -> dict[str, Any]:
    """What names a list item (a queue entry: its name and node pool), tested before any
    change inside it so an index never lands on another entry."""
    if not isinstance(value, dict):
        return {}
    return {k: value[k] for k in ("name", "nodepool") if k in value}


def patch_ops(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations from ``old`` to ``new``, each change preceded by a ``test`` of
    what it reads: the old value before a ``replace`` or ``remove``, the whole old object
    before an ``add`` into it (a member someone else added would otherwise be replaced),
    the whole old list when its length changes, an entry's name and pool before a change
    inside it."""
    if type(old) is type(new) and old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        added = [k for k in new if k not in old]
        if added:
            ops.append({"op": "test", "path": path, "value": old})
        for k in old:
            here = f"{path}/{_escape(k)}"
            if k not in new:
                ops += [{"op": "test", "path": here, "value": old[k]}, {"op": "remove", "path": here}]
            else:
                ops += patch_ops(old[k], new[k], here)
        ops += [{"op": "add", "path": f"{path}/{_escape(k)}", "value": new[k]} for k in added]
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        ops = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            inner = patch_ops(a, b, f"{path}/{i}")
            if inner:
                ops += [{"op": "test", "path": f"{path}/{i}/{_escape(k)}", "value": v}
                        for k, v in _identity(a).items() if isinstance(b, dict) and b.get(k) == v]
                ops += inner
        return ops
    return [{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": new}]


@dataclass(frozen=True)
class Command:
    """One step as kubectl arguments (without ``kubectl``) and its standard input."""

    argv: tuple[str, ...]
    stdin: str = ""
    patch: tuple[dict[str, Any], ...] = ()

    def text(self) -> str:
        line = shlex.join(("kubectl", *self.argv))
        if not self.stdin:
            return line
        return f"{line} <<'EOF'\n{self.stdin.rstrip()}\nEOF"


def _namespace(step: Step) -> tuple[str, ...]:
    return ("-n", step.namespace) if step.namespace else ()


def _manifest(obj: dict[str, Any]) -> dict[str, Any]:
    """What a create sends: the object without what the API server sets."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    kept = {k: v for k, v in (meta or {}).items()
            if k in ("name", "namespace", "labels", "annotations", "ownerReferences")}
    return {k: v for k, v in {**obj, "metadata": kept}.items() if k != "status"}


def command_of(step: Step) -> Command:
    resource = resource_of(step.kind, step.api_version)
    if step.op == "create" and step.after is not None:
        text = orjson.dumps(_manifest(step.after), option=orjson.OPT_INDENT_2).decode()
        return Command(("create", "-f", "-"), text + "\n")
    if step.op == "delete":
        return Command(("delete", resource, step.name, *_namespace(step)))
    ops = patch_ops((step.before or {}).get("spec"), (step.after or {}).get("spec"), "/spec")
    body = orjson.dumps(ops).decode()
    return Command(("patch", resource, step.name, *_namespace(step), "--type=json", "-p", body),
                   patch=tuple(ops))
