"""HTTP fuzz of the real server: ``python -m app serve`` on 127.0.0.1 with a self-signed
certificate, one persistent HTTPS client (it reconnects only when the server closes the
connection), and hypothesis generating the requests:

- wrong types at every path of a review (any node of a Pod, a Deployment or a random
  object of any kind the rules judge, and of the AdmissionReview around it), deep
  nesting (to 3,000 levels), 5,000-digit numbers, huge exponents, long strings;
- encodings: UTF-8, UTF-8 with a BOM, UTF-16, invalid UTF-8, truncated bodies;
- content types and methods, and the other paths.

Required: no 5xx, every 200 carries the request's uid, every request gets an answer,
and the server's log has no ``internalErrors`` and no traceback. At least 10,000 inputs
per run (``ENVELOPE_FUZZ_EXAMPLES`` for a longer one; the result is printed and a longer
run is recorded in docs/reliability.md). Marked e2e: it takes about a minute."""

from __future__ import annotations

import collections
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.test_fuzz import objects

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("ENVELOPE_FUZZ_EXAMPLES", "10000"))

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                      "labels": {"app": "x"}},
       "spec": {"containers": [{"name": "c", "image": "i",
                                "resources": {"limits": {"cpu": "2", "memory": "1Gi",
                                                         "nvidia.com/gpu": "1"},
                                              "requests": {"cpu": "1", "memory": "1Gi"}}}],
                "initContainers": [{"name": "i", "image": "i", "restartPolicy": "Always",
                                    "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}],
                "overhead": {"memory": "10Mi"}}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "d", "namespace": "ns"},
              "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "x"}},
                       "template": {"metadata": {"labels": {"app": "x"}}, "spec": POD["spec"]}}}


def review(obj: dict[str, Any], group: str, version: str, kind: str, operation: str,
           uid: str) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid, "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "operation": operation, "namespace": "ns", "name": "x", "dryRun": False,
        "userInfo": {"username": "fuzz", "groups": ["system:authenticated"]},
        "object": obj}
    if operation == "UPDATE":
        request["oldObject"] = obj
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path in a JSON document (the root excluded)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


def put(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


# Values too big or deep for json.dumps are spliced in as text after dumping.
SPLICE = {
    "@deep-list@": "[" * 3000 + "]" * 3000,
    "@deep-object@": '{"a":' * 1200 + "1" + "}" * 1200,
    "@deep-quantity@": '{"memory":' * 600 + '"1Gi"' + "}" * 600,
    "@digits@": "9" * 5000,
    "@neg-digits@": "-" + "7" * 4400,
    "@exp@": "1e999999",
    "@float@": "1.7976931348623157e309",
    "@nan@": "NaN",
}
wrong_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "1", "-1", "0.5", "1e999", "1E-999", "1Ei", "9Ei", "99999999999999999999Ei",
                     "1.5Gi", "250m", "0.0001m", "+1", ".5", "1e", "Gi", "1 Gi", "Infinity", "NaN",
                     "\u0000", "\ud7ff\ue000", "π", "CREATE", "Pod", "AdmissionReview"]),
    st.sampled_from(list(SPLICE)),
    st.text(max_size=40),
    st.integers(1, 200_000).map(lambda n: "x" * n),
)
wrong_values = st.recursive(wrong_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["cpu", "memory", "limits", "requests", "spec", "name",
                                     "containers", "uid", "kind", "x"]), inner, max_size=4)),
    max_leaves=12)

CONTENT_TYPES = ["application/json"] * 12 + [
    "application/json; charset=utf-8", "Application/JSON", "application/json;charset=utf-16",
    "text/plain", "application/yaml", "application/x-www-form-urlencoded", "application/jsonx",
    "", "*/*", "multipart/form-data; boundary=x"]
METHODS = ["POST"] * 20 + ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
TARGETS = ["/mutate"] * 8 + ["/validate"] * 8 + ["/healthz", "/readyz", "/", "/mutate/x",
                                                 "/metrics", "/mutate?timeout=10s"]
ENCODINGS = ["utf-8"] * 10 + ["utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1",
                              "invalid-utf-8", "truncated"]


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, str | None, bytes, str | None]:
    """(method, target, content type, body, uid expected in a 200 or None)."""
    uid = f"fuzz-{draw(st.integers(0, 10**9))}"
    base = draw(st.sampled_from(["pod", "deployment", "random"]))
    operation = draw(st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"]))
    if base == "pod":
        doc = review(json.loads(json.dumps(POD)), "", "v1", "Pod", operation, uid)
    elif base == "deployment":
        doc = review(json.loads(json.dumps(DEPLOYMENT)), "apps", "v1", "Deployment", operation, uid)
    else:
        group, kind, obj = draw(objects())
        doc = review(obj, group, obj["apiVersion"].split("/")[-1], kind, operation, uid)
    for _ in range(draw(st.integers(0, 3))):
        where = list(paths(doc))
        put(doc, draw(st.sampled_from(where)), draw(wrong_values))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    for marker, raw in SPLICE.items():
        text = text.replace(json.dumps(marker), raw)
    encoding = draw(st.sampled_from(ENCODINGS))
    if encoding == "invalid-utf-8":
        body = text.encode()
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80",
                                                  b"\xf8\x88\x80\x80\x80"])) + body[at:]
    elif encoding == "truncated":
        body = text.encode()[:draw(st.integers(0, max(0, len(text) - 1)))]
    else:
        body = text.encode(encoding, errors="replace" if encoding == "latin-1" else "surrogatepass")
    request = doc.get("request") if isinstance(doc, dict) else None
    sent_uid = request.get("uid") if isinstance(request, dict) else None
    return (draw(st.sampled_from(METHODS)), draw(st.sampled_from(TARGETS)),
            draw(st.sampled_from(CONTENT_TYPES)), body,
            sent_uid if isinstance(sent_uid, str) else None)


class Client:
    """One HTTPS connection, kept alive; reopened only when the server closed it."""

    def __init__(self, port: int, ca: Path) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca))
        self.conn = self._open()
        self.reconnects = 0

    def _open(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)

    def send(self, method: str, target: str, content_type: str | None,
             body: bytes) -> tuple[int, bytes, bool]:
        headers = {"Content-Type": content_type} if content_type else {}
        for attempt in range(2):
            try:
                self.conn.request(method, target, body=body if method != "GET" or body else None,
                                  headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                if response.will_close:
                    self.conn.close()
                    self.conn = self._open()
                    self.reconnects += 1
                return response.status, data, True
            except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine,
                    ssl.SSLError):
                self.conn.close()
                self.conn = self._open()
                self.reconnects += 1
                if attempt:
                    return 0, b"", False
        raise AssertionError("unreachable")


class Server:
    def __init__(self, tmp: Path) -> None:
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tmp / "server.log"
        self.dir = tmp / "tls"
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--metrics-port", "0", "--self-signed", "--self-signed-dir", str(self.dir),
             "--cluster-view", "none"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not start"
            try:
                ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except (OSError, ssl.SSLError, http.client.HTTPException):
                time.sleep(0.2)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("http-fuzz"))
    yield s
    s.stop()


def _deep_affinity() -> tuple[str, str, str, bytes, str]:
    """Found by this fuzz (1 in 10,000 inputs on its first run): a value nested ~600-1,000
    levels deep anywhere in a pod spec made quota-needs-cpu-limits and
    limitrange-needs-cpu-limits crash (RecursionError in scheduling.default_pod's
    deepcopy) into an internal error. Kept as an explicit example."""
    pod = json.loads(json.dumps(POD))
    pod["spec"]["affinity"] = "@deep-object@"
    text = json.dumps(review(pod, "", "v1", "Pod", "CREATE", "fuzz-deep-affinity"))
    text = text.replace('"@deep-object@"', '{"a":' * 800 + "1" + "}" * 800)  # orjson reads 1,024
    return "POST", "/mutate", "application/json", text.encode(), "fuzz-deep-affinity"


DEEP_AFFINITY = _deep_affinity()
STATS: collections.Counter[str] = collections.Counter()
PROBLEMS: list[str] = []


def test_fuzzed_requests_get_a_uid_bearing_answer_or_a_4xx(server: Server) -> None:
    client = Client(server.port, server.dir / "ca.crt")
    rss_start = server.rss_mib()
    started = time.monotonic()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(req=requests())
    @example(req=DEEP_AFFINITY)
    def one(req: tuple[str, str, str | None, bytes, str | None]) -> None:
        method, target, content_type, body, uid = req
        status, data, answered = client.send(method, target, content_type, body)
        STATS["inputs"] += 1
        STATS[f"status {status}"] += 1
        if not answered:
            PROBLEMS.append(f"no answer: {method} {target} {content_type} {body[:120]!r}")
        elif status >= 500:
            PROBLEMS.append(f"{status}: {method} {target} {content_type} {body[:200]!r} -> {data[:300]!r}")
        elif status == 200 and target.split("?")[0] in ("/mutate", "/validate"):
            answer = json.loads(data)
            got = answer.get("response", {}).get("uid")
            if got != uid:
                PROBLEMS.append(f"uid {got!r} != {uid!r}: {body[:200]!r}")
            STATS["allowed" if answer["response"]["allowed"] else "denied"] += 1

    one()
    elapsed = time.monotonic() - started
    time.sleep(0.5)  # the last log lines
    log = server.log.read_text(errors="replace")
    internal = len(re.findall(r'"internalErrors"', log))
    tracebacks = log.count("Traceback")
    STATS["reconnects"] = client.reconnects
    summary = (f"{STATS['inputs']} inputs in {elapsed:.0f} s; {dict(sorted(STATS.items()))}; "
               f"internalErrors lines {internal}, tracebacks {tracebacks}; "
               f"RSS {rss_start:.0f} -> {server.rss_mib():.0f} MiB")
    print(summary)
    assert STATS["inputs"] >= min(EXAMPLES, 10_000), summary
    assert not PROBLEMS, "\n".join(PROBLEMS[:20]) + "\n" + summary
    assert internal == 0 and tracebacks == 0, summary + "\n" + "\n".join(
        line for line in log.splitlines() if "internalErrors" in line or "Error" in line)[:5000]
    assert server.proc.poll() is None, "the server died"
