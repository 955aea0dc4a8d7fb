"""Reviews of objects the API server stores are answered, not refused 413 (issue 25,
class 4), on the real ``envelope serve``.

An object is stored if etcd takes it (1.5 MiB); the review carries it re-encoded by Go,
which writes ``<``, ``>`` and ``&`` as ``\\u003c``-style escapes: six bytes for one. A
Pod with 1.4 MB of XML in an env value is a 1.4 MB request, 1.4 MB in etcd, and an
8.4 MB review — 413 under the old fixed 3 MiB cap, so the write failed. An UPDATE
carries two. The default cap (``MAX_BODY``, 19 MiB: two objects at etcd's limit,
escaped 6x, plus 1 MiB) answers both; past it the 413 names the flag to raise."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.serve.httplimits import ETCD_MAX_REQUEST_BYTES, MAX_BODY
from tests.helpers.serve import Serve, closed_after, start_serve


def _pod(value_bytes: int, env_vars: int = 0) -> dict[str, Any]:
    """A Pod with ``value_bytes`` of markup in one env value (and ``env_vars`` small ones)."""
    env = [{"name": "PAGE", "value": "<p>&</p>" * (value_bytes // 8)}]
    env += [{"name": f"V{i}", "value": "x"} for i in range(env_vars)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "big", "namespace": "a", "uid": "0b7e"},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:1", "env": env,
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": {"memory": "1Gi"}}}]}}


def _go_escaped(data: bytes) -> bytes:
    """What Go's encoding/json (HTML-safe by default) makes of our JSON."""
    return data.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")


def _review(uid: str, operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bytes:
    request: dict[str, Any] = {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation, "namespace": "a", "name": "big", "object": obj,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}
    if old is not None:
        request["oldObject"] = old
    return _go_escaped(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "request": request}, separators=(",", ":")).encode())


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    srv = start_serve(tmp_path_factory.mktemp("large"))
    yield srv
    srv.proc.terminate()
    srv.proc.wait(10)


def _post(serve: Serve, body: bytes, path: str = "/validate", chunked: bool = False) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Connection: close\r\n").encode()
    with serve.connect() as s:
        if chunked:
            s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            with contextlib.suppress(OSError):  # cut once the 413 is out
                for at in range(0, len(body), 1 << 20):
                    piece = body[at:at + (1 << 20)]
                    s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                s.sendall(b"0\r\n\r\n")
        else:
            s.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            with contextlib.suppress(OSError):
                s.sendall(body)
        return closed_after(s, 60)[1]


def _peak_mib(serve: Serve) -> float:
    for line in Path(f"/proc/{serve.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


STORED = 1_400_000
"""The value's size as sent and as stored: under etcd's 1.5 MiB with the rest of the Pod."""


def test_a_create_the_api_server_stores_is_answered_though_its_review_is_6x(serve: Serve) -> None:
    pod = _pod(STORED)
    sent = json.dumps(pod).encode()
    assert len(sent) < ETCD_MAX_REQUEST_BYTES  # the client's request, and what etcd keeps
    body = _review("create-escaped", "CREATE", pod, None)
    assert len(body) > 5 * 1024 * 1024, len(body)  # 4x the request: over the old 3 MiB cap
    answer = _post(serve, body)
    assert answer.startswith(b"HTTP/1.1 200") and b'"uid":"create-escaped"' in answer, answer[:300]


def test_an_update_carrying_two_such_objects_is_answered(serve: Serve) -> None:
    pod = _pod(STORED)
    body = _review("update-escaped", "UPDATE", pod, pod)
    assert 10 * 1024 * 1024 < len(body) < MAX_BODY, len(body)
    started = time.monotonic()
    answer = _post(serve, body)
    print(f"UPDATE review of {len(body) / 2**20:.1f} MiB answered in "
          f"{time.monotonic() - started:.2f} s; peak RSS {_peak_mib(serve):.0f} MiB")
    assert answer.startswith(b"HTTP/1.1 200") and b'"uid":"update-escaped"' in answer, answer[:300]


def test_an_update_of_many_small_fields_at_the_etcd_limit_is_answered(serve: Serve) -> None:
    """The shape that costs most memory to decode: ~100,000 env vars, ~1.4 MB in
    protobuf (about 14 bytes each), 2.5 MB of JSON per object."""
    pod = _pod(0, env_vars=100_000)
    body = _review("update-small-fields", "UPDATE", pod, pod)
    before = _peak_mib(serve)
    started = time.monotonic()
    answer = _post(serve, body)
    print(f"UPDATE review of {len(body) / 2**20:.1f} MiB (2 x 100,000 env vars) answered in "
          f"{time.monotonic() - started:.2f} s; peak RSS {before:.0f} -> {_peak_mib(serve):.0f} MiB")
    assert answer.startswith(b"HTTP/1.1 200") and b'"uid":"update-small-fields"' in answer, \
        answer[:300]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_review_over_the_cap_gets_413_that_names_the_flag(serve: Serve, chunked: bool) -> None:
    pod = _pod(MAX_BODY // 2 // 3)
    body = _review("too-big", "UPDATE", pod, pod)
    assert len(body) > MAX_BODY
    answer = _post(serve, body, chunked=chunked)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert f"{MAX_BODY}-byte limit".encode() in answer and b"--max-body-bytes" in answer, answer
