"""``envelope quotas plan --serve``: the planner's page on 127.0.0.1. Bars per pool and per
department with named segments, search, human units, edits of guarantee, limit and
over-quota weight, and new departments and projects; every edit is judged at once by
the planner (``plan.py``: the rules the webhook runs, over the target and over every
intermediate state), and the commands cannot be exported while an error stands. It reads
what it was given (files or a cluster listed once) and writes nothing to a cluster; over a
git ref (``--git-ref``) it commits the plan on a new local branch when asked
(``/api/commit``, ``plangit.commit_change``: working tree, index and HEAD untouched).

The page is one HTML document with inline CSS and script; it fetches only this server's
``/api/judge``, ``/api/export`` and ``/api/commit`` (POST, JSON: ``{"edits": [...]}``,
and ``"branch"`` for a commit)."""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.core.config import Policy
from app.core.ruleset import RuleSet
from app.quotaview.model import as_json, tree_of
from app.quotaview.plan import GUARANTEE, plan
from app.quotaview.plancommands import command_of

__all__ = ["CommitError", "Committer", "Planner", "apply_edits", "serve"]

FIELDS = ("guarantee", "limit", "overQuotaWeight", "priority")
MAX_BODY = 1 << 20


class EditError(ValueError):
    """An edit that names no queue, or a value that is not a number."""


class CommitError(RuntimeError):
    """The plan cannot be committed (a branch that exists, a value not writable in place)."""


Committer = Callable[[list[dict[str, Any]], str], dict[str, Any]]
"""Git mode: the target objects and a new branch's name -> what was committed (``branch``,
``commit``, ``files``, ``notWritten``, ``diff``); raises :class:`CommitError`."""


def _entry(obj: dict[str, Any], pool: str) -> dict[str, Any] | None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    if obj.get("kind") == "Queue":
        return spec
    for entry in spec.get("queues") or []:
        if isinstance(entry, dict) and entry.get("nodepool") == pool:
            return entry
    return None


NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A Department's or Project's name, and its queue entries' (``<name>-<pool>``): a DNS-1123
label, as KAI names the Queue it makes of each entry."""
KRM = "kai.resources/v1alpha1"


def _number(label: str, value: Any) -> int | float:
    try:
        number = Decimal(str(value))
    except InvalidOperation as exc:
        raise EditError(f"{label}: {value!r} is not a number") from exc
    if isinstance(value, bool) or not number.is_finite():
        raise EditError(f"{label}: {value!r} is not a number")
    return int(number) if number == number.to_integral_value() else float(number)


def _add(out: list[dict[str, Any]], by_key: dict[tuple[Any, Any], dict[str, Any]],
         edit: dict[str, Any]) -> None:
    """A new Department or Project (``{op: add, kind, name, pool, parent, resources}``), or a
    queue on a new pool for one that exists: one queue entry ``<name>-<pool>`` with the
    numbers given (``resources: {gpu: {guarantee, limit, overQuotaWeight}}``; a resource
    left out guarantees 0, unlimited, weight 1)."""
    kind, name, pool, parent = edit.get("kind"), edit.get("name"), edit.get("pool"), edit.get("parent")
    if kind not in ("Department", "Project"):
        raise EditError(f"cannot add a {kind}: the page adds a Department or a Project")
    pools = {(o.get("metadata") or {}).get("name") for o in out if o.get("kind") == "NodePool"}
    if not isinstance(name, str) or not NAME.fullmatch(name) or len(f"{name}-{pool}") > 63:
        raise EditError(f"{kind} name {name!r}: lower-case letters, digits and '-', starting and "
                        f"ending with a letter or digit, at most 63 characters with '-{pool}'")
    if pool not in pools:
        raise EditError(f"{kind} {name}: no NodePool {pool!r} (known: {', '.join(sorted(map(str, pools)))})")
    if kind == "Project" and by_key.get(("Department", parent)) is None:
        raise EditError(f"Project {name}: no Department {parent!r} to be its parent")
    found = edit.get("resources")
    given: dict[str, Any] = found if isinstance(found, dict) else {}
    resources: dict[str, Any] = {}
    for resource in ("gpu", "cpu", "memory"):
        found = given.get(resource)
        numbers: dict[str, Any] = found if isinstance(found, dict) else {}
        resources[resource] = {
            "deserved": _number(f"{kind} {name} {resource} guarantee", numbers.get("guarantee", 0)),
            "limit": _number(f"{kind} {name} {resource} limit", numbers.get("limit", -1)),
            "overQuotaWeight": _number(f"{kind} {name} {resource} overQuotaWeight",
                                       numbers.get("overQuotaWeight", 1))}
    entry = {"name": f"{name}-{pool}", "nodepool": pool, "resources": resources}
    obj = by_key.get((kind, name))
    if obj is None:
        spec: dict[str, Any] = {"parent": parent} if kind == "Project" else {}
        obj = {"apiVersion": KRM, "kind": kind, "metadata": {"name": name}, "spec": {**spec, "queues": []}}
        out.append(obj)
        by_key[(kind, name)] = obj
    elif kind == "Project" and (obj.get("spec") or {}).get("parent") != parent:
        raise EditError(f"Project {name} exists under Department {(obj.get('spec') or {}).get('parent')}, "
                        f"not {parent}")
    if _entry(obj, str(pool)) is not None:
        raise EditError(f"{kind} {name} already has a queue on pool {pool}: edit its numbers")
    spec = obj.setdefault("spec", {})
    if not isinstance(spec.get("queues"), list):
        spec["queues"] = []
    spec["queues"].append(entry)


def apply_edits(objects: list[dict[str, Any]], edits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects with each edit written in: ``{kind, name, pool, resource, field, value}``
    (``field`` one of guarantee, limit, overQuotaWeight, priority; a number in the spec's
    units), and ``{op: add, ...}`` (:func:`_add`): additions first, Departments before
    Projects, so a number edited on an added queue and a project under an added department
    both find theirs."""
    out = copy.deepcopy(objects)
    by_key = {(o.get("kind"), (o.get("metadata") or {}).get("name")): o for o in out}
    if not all(isinstance(edit, dict) for edit in edits):
        raise EditError("an edit is an object")
    adds = [e for e in edits if e.get("op") == "add"]
    for edit in sorted(adds, key=lambda e: e.get("kind") != "Department"):
        _add(out, by_key, edit)
    for edit in edits:
        if edit.get("op") == "add":
            continue
        kind, name, pool = edit.get("kind"), edit.get("name"), str(edit.get("pool") or "")
        resource, field, value = edit.get("resource"), edit.get("field"), edit.get("value")
        obj = by_key.get((kind, name))
        if obj is None or kind not in GUARANTEE:
            raise EditError(f"no {kind} {name} to edit")
        if resource not in ("gpu", "cpu", "memory") or field not in FIELDS:
            raise EditError(f"cannot edit {resource} {field}")
        number = _number(f"{kind} {name} {resource} {field}", value)
        entry = _entry(obj, pool)
        if entry is None:
            raise EditError(f"{kind} {name} has no queue on pool {pool}")
        if field == "priority":  # a KAI Queue's (KRM's queue entries carry none)
            if kind != "Queue" or not isinstance(number, int):
                raise EditError(f"{kind} {name}: priority is a whole number of a KAI Queue")
            entry["priority"] = number
            continue
        resources = entry.setdefault("resources", {})
        block = resources.setdefault(resource, {})
        block[GUARANTEE[str(kind)] if field == "guarantee" else field] = number
    return out


def _values(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """Per queue (``kind/name/pool``) the numbers as written, for the page's inputs."""
    out: dict[str, Any] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind not in GUARANTEE:
            continue
        name = (obj.get("metadata") or {}).get("name")
        found = obj.get("spec")
        spec: dict[str, Any] = found if isinstance(found, dict) else {}
        entries = [spec] if kind == "Queue" else [e for e in spec.get("queues") or [] if isinstance(e, dict)]
        for entry in entries:
            pool = "" if kind == "Queue" else str(entry.get("nodepool", ""))
            found = entry.get("resources")
            resources: dict[str, Any] = found if isinstance(found, dict) else {}
            numbers: dict[str, Any] = {
                r: {"guarantee": b.get(GUARANTEE[kind]), "limit": b.get("limit"),
                    "overQuotaWeight": b.get("overQuotaWeight")}
                for r, b in resources.items() if isinstance(b, dict)}
            if kind == "Queue":
                numbers["priority"] = entry.get("priority")
            out[f"{kind}/{name}/{pool}"] = numbers
    return out


class Planner:
    """The base the page edits, and the judging of a set of edits."""

    def __init__(self, base: list[dict[str, Any]], rules: RuleSet, policy: Policy, source: str,
                 at: str, commit: Committer | None = None) -> None:
        self.base, self.rules, self.policy, self.source, self.at = base, rules, policy, source, at
        self.commit = commit

    def judge(self, edits: list[dict[str, Any]]) -> dict[str, Any]:
        target = apply_edits(self.base, edits)
        planned = plan(self.base, target, self.rules, self.policy)
        # The target's errors come over-reacher first (plan._blame): the object that grew.
        errors = [{"kind": b.kind, "name": b.name, "rule": b.rule, "message": b.message,
                   "overReached": i == 0 and bool(planned.target_errors)}
                  for i, b in enumerate([*planned.target_errors, *planned.blocked])]
        errors += [{"kind": "", "name": "", "rule": "planner", "message": u} for u in planned.unplanned]
        errors = _grouped(errors)
        return {"source": self.source, "at": self.at, "ok": planned.ok, "errors": errors,
                "git": self.commit is not None,
                "tree": as_json(tree_of(target, self.rules, self.policy)), "values": _values(target),
                "commands": [command_of(s).text() for s in planned.steps] if planned.ok else []}


def _grouped(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per sum: a sum that does not fit is reported on every object holding part
    of it; the first (the over-reacher) keeps the message, the others are named in
    ``alsoOn``."""
    out: list[dict[str, Any]] = []
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for e in errors:
        group = (e["rule"], str(e["message"]).split(" This write gives ")[0])
        if group in first and e["name"]:
            first[group]["alsoOn"].append(e["name"])
            continue
        first[group] = e = {**e, "alsoOn": []}
        out.append(e)
    return out


def _body(raw: bytes, commit: bool) -> tuple[list[dict[str, Any]], str]:
    """The edits of a request body, and for a commit the new branch's name."""
    body = json.loads(raw or b"{}")
    edits = body.get("edits", []) if isinstance(body, dict) else None
    if not isinstance(edits, list):
        raise EditError("the body is {\"edits\": [...]}")
    branch = body.get("branch") if commit and isinstance(body, dict) else ""
    if commit and (not isinstance(branch, str) or not branch):
        raise EditError("a commit needs \"branch\": the name of a new local branch")
    return edits, str(branch)


def _handler(planner: Planner, page: Callable[[], str]) -> type[BaseHTTPRequestHandler]:
    """The page's request handler: ``GET /`` and the three ``POST /api/`` endpoints.

    Why one function of ~76 lines: it is one class, closed over ``planner`` and ``page``
    (the standard library's server makes a handler per request from the class alone)."""
    class Handler(BaseHTTPRequestHandler):
        server_version = "envelope-quota-planner"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, value: Any) -> None:
            self._send(code, json.dumps(value).encode(), "application/json")

        def do_GET(self) -> None:
            if self.path in ("/", "/index.html"):
                self._send(200, page().encode(), "text/html; charset=utf-8")
            else:
                self._json(404, {"error": f"no page {self.path}"})

        def do_POST(self) -> None:
            if self.path not in ("/api/judge", "/api/export", "/api/commit"):
                self._json(404, {"error": f"no endpoint {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self._json(413 if length > MAX_BODY else 400, {"error": "a JSON body up to 1 MiB"})
                return
            if self.path == "/api/commit" and planner.commit is None:
                self._json(404, {"error": "no git ref to commit on: start the page with --git-ref"})
                return
            try:
                edits, branch = _body(self.rfile.read(length), self.path == "/api/commit")
                judged = planner.judge(edits)
            except (ValueError, EditError) as exc:
                self._json(400, {"error": str(exc)})
                return
            except Exception as exc:  # a bug of ours: say so, never drop the connection
                self._json(500, {"error": f"internal error {type(exc).__name__}: {exc}"})
                return
            if self.path == "/api/judge":
                self._json(200, judged)
            elif self.path == "/api/commit":
                self._commit(judged, edits, branch)
            elif not judged["ok"]:
                self._json(409, {"error": "the plan cannot be exported while an error stands",
                                 "errors": judged["errors"]})
            else:
                count = len(judged["commands"])
                header = f"# plan from {planner.source} ({planner.at}), {count} command(s)\n"
                self._send(200, (header + "\n".join(judged["commands"]) + "\n").encode(),
                           "text/plain; charset=utf-8")

        def _commit(self, judged: dict[str, Any], edits: list[dict[str, Any]], branch: str) -> None:
            if not judged["ok"]:
                self._json(409, {"error": "the plan cannot be committed while an error stands",
                                 "errors": judged["errors"]})
                return
            assert planner.commit is not None
            try:
                self._json(200, planner.commit(apply_edits(planner.base, edits), branch))
            except CommitError as exc:
                self._json(409, {"error": f"nothing committed: {exc}"})

    return Handler


def serve(planner: Planner, port: int = 0) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start the page on 127.0.0.1 (``port`` 0: any free one); returns the server (its
    ``server_address``) and the thread serving it."""
    from app.quotaview.planpage import page

    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(planner, page))
    thread = threading.Thread(target=server.serve_forever, name="quota-planner", daemon=True)
    thread.start()
    return server, thread
