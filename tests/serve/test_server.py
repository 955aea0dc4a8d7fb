"""The webhook as a real process over real TLS, called the way the API server calls it."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.serve.httplimits import MAX_BODY
from app.serve.tls import write_self_signed
from tests.conftest import container, workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url: str, metrics: str, ca: Path, log: Path) -> None:
        self.url, self.metrics, self.ca, self.log = url, metrics, ca, log
        self.client = httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca),
                                   timeout=10)

    def review(self, obj: dict[str, Any] | None, endpoint: str = "/mutate",
               operation: str = "CREATE", **request: Any) -> dict[str, Any]:
        group, _, version = (obj or {}).get("apiVersion", "apps/v1").rpartition("/")
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u-1", "kind": {"group": group, "version": version,
                                                   "kind": (obj or {}).get("kind", "Deployment")},
                            "operation": operation, "namespace": "team-a", "object": obj,
                            **request}}
        response = self.client.post(endpoint, json=body)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tls")
    certs = write_self_signed(tmp)
    port, metrics = free_port(), free_port()
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--cert-file", str(certs.cert), "--key-file", str(certs.key),
           "--metrics-port", str(metrics), "--cluster-view", "none"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "ENVELOPE_CONFIG": ""})
    srv = Server(f"https://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}", certs.ca, log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if srv.client.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not start:\n{log.read_text()}")
        time.sleep(0.1)
    yield srv
    srv.client.close()
    proc.terminate()
    proc.wait(10)


def test_mutate_returns_a_json_patch(server: Server) -> None:
    obj = workload("Deployment", [container(limits={"cpu": "7", "memory": "29Gi"})])
    out = server.review(obj)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "remove",
            "path": "/spec/template/spec/containers/0/resources/limits/cpu"} in patch
    assert all(len(w) < 120 for w in response.get("warnings", []))


def test_nothing_to_change_means_no_patch(server: Server) -> None:
    obj = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                            limits={"memory": "1Gi"})])
    response = server.review(obj)["response"]
    assert response["allowed"] is True and "patch" not in response and "patchType" not in response


def test_validate_denies_with_numbers_and_dry_run_gets_the_same_answer(server: Server) -> None:
    obj = workload("Deployment", [container("api", requests={"memory": "1Gi"},
                                            limits={"memory": "2Gi"})])
    real = server.review(obj, "/validate")["response"]
    dry = server.review(obj, "/validate", dryRun=True)["response"]
    assert real["allowed"] is False
    assert real["status"]["code"] == 403
    assert 'container "api"' in real["status"]["message"]
    assert "1Gi" in real["status"]["message"] and "2Gi" in real["status"]["message"]
    assert dry == real


def test_unsupported_kind_and_delete_are_allowed(server: Server) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert server.review(cm)["response"] == {"uid": "u-1", "allowed": True}
    assert server.review(None, "/validate", operation="DELETE",
                         oldObject=workload("Pod", [container()]))["response"]["allowed"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "expected an AdmissionReview object"),
        (b'{"kind":"Pod","apiVersion":"v1"}', "kind: expected AdmissionReview"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{}}',
         "apiVersion: expected admission.k8s.io/v1"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}', "request: required"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":5}}',
         "request.uid: expected a string, got int"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":'
         b'{"uid":"x","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE",'
         b'"object":"nope"}}', "request.object: expected an object, got str"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":'
         b'{"uid":"x","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"PATCH"}}',
         "request.operation"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":'
         b'{"uid":"x","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE"}}',
         "request.object: required for CREATE"),
    ],
)
def test_malformed_input_gets_400_that_says_what_is_wrong(server: Server, body: bytes,
                                                          fragment: str) -> None:
    response = server.client.post("/mutate", content=body,
                                  headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert fragment in response.json()["error"]


def test_huge_body_gets_413(server: Server) -> None:
    body = b'{"pad":"' + b"x" * (MAX_BODY + 10) + b'"}'
    json_type = {"content-type": "application/json"}
    response = server.client.post("/validate", content=body, headers=json_type)
    assert response.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed count catches it
        for _ in range(MAX_BODY // (1024 * 1024) + 1):
            yield b"x" * (1024 * 1024)

    assert server.client.post("/validate", content=chunks(), headers=json_type).status_code == 413


def test_a_crafted_object_never_yields_500(server: Server) -> None:
    weird = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": [],
             "spec": {"template": {"spec": {"containers": [
                 {"name": 1, "resources": {"limits": "cpu"}}, "junk",
                 {"resources": {"limits": {"cpu": ["7"]}, "requests": None}}]}}}}
    for endpoint in ("/mutate", "/validate"):
        response = server.review(weird, endpoint)["response"]
        assert response["uid"] == "u-1"


def test_health_metrics_and_logs(server: Server) -> None:
    assert server.client.get("/healthz").status_code == 200
    assert server.client.get("/readyz").status_code == 200
    text = httpx.get(server.metrics + "/metrics").text
    assert ('envelope_admission_requests_total{decision="patch",endpoint="mutate",kind="Deployment",'
            'operation="CREATE"}') in text
    assert "envelope_admission_duration_seconds_bucket" in text
    lines = [json.loads(line) for line in server.log.read_text().splitlines()
             if line.startswith("{") and '"admission"' in line]
    denied = [r for r in lines if r.get("decision") == "deny"]
    assert denied and denied[0]["uid"] == "u-1" and denied[0]["rules"]
    assert {"kind", "namespace", "name", "operation", "durationMs"} <= set(denied[0])


def test_plain_http_and_old_tls_are_refused(server: Server) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.post(server.url.replace("https", "http") + "/mutate", content=b"{}", timeout=3)
    context = ssl.create_default_context(cafile=server.ca)
    with pytest.warns(DeprecationWarning):
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((httpx.TransportError, ssl.SSLError)):
        httpx.get(server.url + "/healthz", verify=context, timeout=3)


def test_wrong_method_and_unknown_path(server: Server) -> None:
    response = server.client.get("/mutate")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert server.client.post("/nope", content=b"{}").status_code == 404


def test_benchmark_floor_routes_echo_the_uid() -> None:
    import asyncio
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_floor", Path(__file__).resolve().parents[2] / "bench" / "floor.py")
    assert spec is not None and spec.loader is not None
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    app = floor.floor_app()
    body = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"abc-1",'
            b'"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":{}}}')

    async def call(path: str) -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post(path, content=body,
                                         headers={"content-type": "application/json"})
        assert response.status_code == 200
        return dict(response.json()["response"])

    assert asyncio.run(call("/floor")) == {"uid": "abc-1", "allowed": True}
    assert asyncio.run(call("/floor-decode")) == {"uid": "abc-1", "allowed": True}
    patched = asyncio.run(call("/floor-patch"))
    assert patched["uid"] == "abc-1" and patched["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(patched["patch"]))[0]["path"] == "/metadata/annotations"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/yaml",
                                          "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_gets_415(server: Server, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = server.client.post("/mutate", content=b"{}", headers=headers)
    assert response.status_code == 415
    assert "Content-Type must be application/json" in response.json()["error"]
    ok = server.client.post("/mutate", content=b"{}",
                            headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 400  # JSON after all: now judged as a (bad) review


def _nested(depth: int) -> Any:
    value: Any = "1Gi"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [300, 1000, 2000])
def test_deep_nesting_is_a_400_or_an_answer_with_the_uid(server: Server, depth: int) -> None:
    deep = '{"a":' * depth + '"1Gi"' + "}" * depth  # as text: encoders refuse this depth
    for where in ("name", "memory"):
        obj = workload("Deployment", [container(requests={"memory": "1Gi"})])
        if where == "name":
            obj["metadata"]["name"] = "DEEP"
        else:
            obj["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "DEEP"
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u-deep", "kind": {"group": "apps", "version": "v1",
                                                      "kind": "Deployment"},
                            "operation": "CREATE", "object": obj}}
        raw = json.dumps(body).replace('"DEEP"', deep).encode()
        for endpoint in ("/mutate", "/validate"):
            response = server.client.post(endpoint, content=raw,
                                          headers={"content-type": "application/json"})
            assert response.status_code in (200, 400), response.text[:200]
            if response.status_code == 200:
                assert response.json()["response"]["uid"] == "u-deep"
            else:
                assert "not valid JSON" in response.json()["error"]


def test_an_answer_that_cannot_be_encoded_is_a_denial_with_the_uid() -> None:
    import asyncio

    from app.core.config import Policy
    from app.serve.admission import Decision
    from app.serve.server import create_app
    from tests.conftest import RULES

    app = create_app(RULES, Policy())
    # A rule set whose one mutating rule writes a value nested past orjson's limit.
    from dataclasses import replace

    from app.core.ruleset import RuleSet
    from app.rules.base import change

    def deepens(subject: Any, obj: Any, view: Any, policy: Any) -> list[Any]:
        obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": _nested(400)}}
        return [change("spec.template.spec.containers[0].resources", "nested")]

    rules = RuleSet([replace(RULES["memory-limit"], fn=deepens)], RULES.copiers, updates=RULES.updates)
    app = create_app(rules, Policy())
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-enc", "kind": {"group": "apps", "version": "v1",
                                                            "kind": "Deployment"},
                                   "operation": "CREATE",
                                   "object": workload("Deployment", [container()])}})

    async def post() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/mutate", content=body,
                                     headers={"content-type": "application/json"})

    response = asyncio.run(post())
    assert response.status_code == 200
    answer = response.json()["response"]
    assert answer["uid"] == "u-enc" and answer["allowed"] is False
    assert answer["status"]["code"] == 400 and "nests too deeply" in answer["status"]["message"]
    assert Decision  # the decision type the server builds for it
