"""The typed admission boundary (app/serve/admission.py, app/serve/server.py): the handler turns a
decoded request into a response, and a verified caller is counted exactly once per
request, whatever the body turns out to be."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterable
from typing import Any

import httpx
import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.serve.admission import Request, RuleHandler, parse_review
from app.serve.callerauth import Caller, CallerCheck, CallerTokenError, KeySource
from app.serve.server import create_app
from tests.conftest import RULES, container, workload


def review(obj: dict[str, Any], group: str = "apps", kind: str = "Deployment") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "operation": "CREATE",
                                   "kind": {"group": group, "version": "v1", "kind": kind},
                                   "resource": {"group": group, "version": "v1",
                                                "resource": kind.lower() + "s"},
                                   "namespace": "team-a", "object": obj}}).encode()


CPU7 = workload("Deployment", [container(requests={"memory": "1Gi"},
                                         limits={"cpu": "7", "memory": "1Gi"})])


def test_the_handler_answers_a_decoded_request_with_its_evaluation() -> None:
    uid, subject = parse_review(review(CPU7))
    handler = RuleHandler(RULES, Policy(), StaticView())
    response = handler.handle(Request(uid, subject, "mutate"))
    assert response.uid == "u-1" and response.decision.allowed
    assert response.evaluation is not None
    assert [c.path for c in response.evaluation.changes if c.rule == "cpu-limits"] == [
        "spec.template.spec.containers[0].resources.limits.cpu"]
    patch = response.decision.patch or []
    assert [op["op"] for op in patch] and all(op["path"].startswith("/") for op in patch)
    encoded = json.loads(response.encode())["response"]
    assert encoded["uid"] == "u-1" and encoded["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(encoded["patch"])) == patch


class Exploding(StaticView):
    """A view that fails where the engine itself reads it, outside any rule."""

    def problems(self, kinds: Any = None) -> list[str]:
        raise RuntimeError("boom")


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_an_engine_failure_is_answered_per_failure_mode_without_an_evaluation(
        failure_mode: str) -> None:
    obj = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})])
    uid, subject = parse_review(review(obj))
    handler = RuleHandler(RULES, Policy(failureMode=failure_mode), Exploding())
    response = handler.handle(Request(uid, subject, "validate"))
    assert response.evaluation is None
    assert response.decision.allowed is (failure_mode == "allow")
    assert response.decision.code == 500
    assert response.decision.message == "Envelope internal error: RuntimeError"


class Verified(CallerCheck):
    """A CallerCheck whose token check always passes with a caller attesting ``group``
    (the signature checks are test_callerauth.py's); ``settle`` is the real one."""

    def __init__(self, group: str) -> None:
        super().__init__("enforce", KeySource(lambda path, accept: {}, []))
        self.group = group

    async def check(self, headers: Iterable[tuple[bytes, bytes]], path: str
                    ) -> Caller | CallerTokenError:
        return Caller("system:apiserver", "validatingwebhookconfiguration", "envelope", "uid-1",
                      ("https://envelope",), self.group, time.time() + 600)


def deep(depth: int = 1_100) -> bytes:
    nested = '{"a":' * depth + '"x"' + "}" * depth
    return (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{'
            b'"uid":"u-deep","kind":{"group":"","version":"v1","kind":"ConfigMap"},'
            b'"operation":"CREATE","namespace":"team-a","object":{"data":' + nested.encode()
            + b"}}}")


@pytest.mark.parametrize(("group", "body", "headers", "status", "counted"), [
    ("*", review(CPU7), {}, 200, ["valid"]),
    ("apps", review(CPU7), {}, 200, ["valid"]),
    ("", review(CPU7), {}, 403, ["api-group"]),
    ("*", b"not json", {}, 400, ["valid"]),
    ("*", b'{"kind": "AdmissionReview"}', {}, 400, ["valid"]),
    ("*", deep(), {}, 200, ["valid"]),
    ("*", b"{}", {"content-length": str(1 << 40)}, 413, ["valid"]),
])
def test_a_verified_caller_is_counted_once_per_request(
        group: str, body: bytes, headers: dict[str, str], status: int, counted: list[str]) -> None:
    checker = Verified(group)
    app = create_app(RULES, Policy(), caller=checker)
    seen: list[str] = []
    checker.count = seen.append  # after create_app, which points it at the metrics

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/validate", content=body,
                                     headers={"content-type": "application/json", **headers})

    response = asyncio.run(go())
    assert response.status_code == status, response.text
    assert seen == counted
    if status == 403:
        assert response.json()["error"].startswith("caller token refused (api-group): ")


@pytest.mark.parametrize("meta", [{"name": "web", "labels": {"app": True}},
                                  {"name": "web", "annotations": ["a"]}, {"name": 7}])
def test_metadata_of_the_wrong_type_is_refused_with_the_uid_never_judged(meta: dict[str, Any]) -> None:
    # The API server never sends these (it decodes ObjectMeta first); anyone else is refused.
    obj = {**CPU7, "metadata": meta}
    uid, subject = parse_review(review(obj))
    for phase in ("mutate", "validate"):
        response = RuleHandler(RULES, Policy(), StaticView()).handle(Request(uid, subject, phase))
        assert not response.decision.allowed and response.decision.code == 400
        assert response.decision.message.startswith("metadata.")
        assert json.loads(response.encode())["response"]["uid"] == "u-1"
    # kinds Envelope does not judge stay allowed unchanged
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    uid, subject = parse_review(review(other, group="", kind="ConfigMap"))
    assert RuleHandler(RULES, Policy(), StaticView()).handle(Request(uid, subject, "mutate")).decision.allowed
