"""The review paths are answered ahead of FastAPI's stack (``create_app``'s front):
every request must get exactly the answer the router gives it, whatever the path, the
method, the media type or the body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI

from app.core.config import Policy
from app.core.ruleset import default_ruleset
from app.intree.validating import VALIDATE_PATH
from app.serve.server import create_app
from tests.conftest import container, workload


def _call(app: Any, method: str, path: str, body: bytes, media: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request through ``app`` as ASGI; status, headers and body."""
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", media),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8443)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent
                                               if m["type"] == "http.response.body")


def _review(obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": "team", "operation": "CREATE", "userInfo": {"username": "me"},
        "object": obj, "oldObject": None, "dryRun": False}}).encode()


def test_the_front_answers_every_request_as_the_router_does() -> None:
    app = create_app(default_ruleset(), Policy())

    async def router(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await FastAPI.__call__(app, scope, receive, send)  # the stack, without the front

    bad = workload("Deployment", [container("app", requests={"memory": "1Gi", "cpu": "1"},
                                            limits={"memory": "2Gi", "cpu": "2"})])
    bodies = [_review(bad), b"{", b"", b'{"kind": "AdmissionReview", "request": []}']
    paths = ["/mutate", "/validate", "/mutate/", "/validate/", "/Mutate", "/mutate/x",
             f"{VALIDATE_PATH}memory-request-equals-limit", f"{VALIDATE_PATH}no-such-rule",
             VALIDATE_PATH, f"{VALIDATE_PATH}a/b", "/validate/in-tree", "/healthz", "/nope"]
    compared = 0
    for path in paths:
        for method in ("POST", "GET", "PUT"):
            for media in (b"application/json", b"text/plain"):
                for body in bodies:
                    got = _call(app, method, path, body, media)
                    want = _call(router, method, path, body, media)
                    assert got == want, (method, path, media, body[:20])
                    compared += 1
    assert compared == len(paths) * 3 * 2 * len(bodies)


def test_the_front_takes_only_the_review_paths() -> None:
    app = create_app(default_ruleset(), Policy())
    assert set(app.reviews) == {"/mutate", "/validate"}
    status, _, body = _call(app, "POST", "/mutate", _review(workload("Deployment", [
        container("app", requests={"memory": "1Gi"}, limits={"memory": "1Gi", "cpu": "1"})])),
        b"application/json")
    answer = json.loads(body)["response"]
    assert status == 200 and answer["uid"] == "u-1" and answer["patchType"] == "JSONPatch"
