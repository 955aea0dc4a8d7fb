"""Reviews whose object nests deeper than orjson reads (1,024 levels).

The API server stores custom resources up to 10,000 levels deep
(``x-kubernetes-preserve-unknown-fields``) and sends their reviews (e2e/test_deep_objects.py
stores a WorkerPool 1,100 deep). Such a review gets an answer with its uid — refused or
allowed per ``failureMode``, saying why — not a 400 that the API server shows its user as
"the server rejected our request for an unknown reason"."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.core.config import Policy
from app.serve.server import create_app
from tests.conftest import RULES


def deep_review(depth: int, uid: str = "u-deep", pad: int = 0) -> bytes:
    extra = '{"a":' * depth + '"x"' + "}" * depth
    return (
        '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{'
        f'"uid":"{uid}","kind":{{"group":"ate.dev","version":"v1alpha1","kind":"WorkerPool"}},'
        '"operation":"CREATE","namespace":"team-a","name":"deep","object":{'
        '"apiVersion":"ate.dev/v1alpha1","kind":"WorkerPool","metadata":{"name":"deep",'
        f'"namespace":"team-a","annotations":{{"pad":"{"p" * pad}"}}}},"spec":{{"replicas":1,'
        f'"sandboxClass":"microvm","extra":{extra}}}}}}}}}').encode()


def post(body: bytes, policy: Policy) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(RULES, policy))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/validate", content=body,
                                     headers={"content-type": "application/json"})
    return asyncio.run(go())


@pytest.mark.parametrize("depth", [1_100, 9_000])
def test_a_review_too_deep_to_decode_is_answered_with_its_uid(depth: int) -> None:
    response = post(deep_review(depth), Policy())
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()["response"]
    assert answer["uid"] == "u-deep" and answer["allowed"] is False
    assert answer["status"]["code"] == 400
    assert "nests deeper than 1,024 levels" in answer["status"]["message"]
    assert "denied because failureMode is deny" in answer["status"]["message"]


def test_with_failure_mode_allow_it_is_allowed_with_a_warning() -> None:
    answer = post(deep_review(1_100), Policy(failure_mode="allow")).json()["response"]
    assert answer["allowed"] is True and answer["uid"] == "u-deep"
    assert any("nests deeper than 1,024 levels" in w for w in answer["warnings"])


def test_a_deep_body_that_is_not_a_review_or_too_large_is_still_a_400() -> None:
    assert post(b'{"a":' * 2000 + b"1" + b"}" * 2000, Policy()).status_code == 400
    assert post(deep_review(1_100, pad=1024 * 1024), Policy()).status_code == 400
