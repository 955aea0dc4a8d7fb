"""CPU per review through the ASGI app alone: no sockets, no TLS, no HTTP parsing.

Drives the app the server builds (``create_app``) with ASGI events in one process and
reports process CPU µs per ``POST /mutate`` and ``/validate`` (the same 5 KB
Deployment as ``bench/webhook.py``). CPU time, not wall time, so it stays usable on a
busy machine; compare two trees by running this file from each (``--repo DIR``) in
alternation. Run by hand; never in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def load(repo: Path) -> tuple[Any, bytes]:
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(repo / "bench"))
    from webhook import review_body  # type: ignore[import-not-found]

    from app.core.config import Policy
    from app.serve.logs import admission_log
    from app.serve.server import create_app

    admission_log.enabled = False  # as --log-level warning
    if "rules" in inspect.signature(create_app).parameters:
        from app.core.ruleset import default_ruleset

        return create_app(default_ruleset(), Policy()), review_body()
    return create_app(Policy()), review_body()


async def call(app: Any, path: str, body: bytes) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8443), "state": {}}
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def measure(app: Any, path: str, body: bytes, n: int) -> float:
    for _ in range(500):
        assert await call(app, path, body) == 200
    start = time.process_time()
    for _ in range(n):
        await call(app, path, body)
    return (time.process_time() - start) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    app, body = load(args.repo.resolve())
    for path in ("/mutate", "/validate"):
        samples = [asyncio.run(measure(app, path, body, args.requests)) for _ in range(args.repeats)]
        print(f"{path}: median {statistics.median(samples):.1f} µs CPU per review "
              f"(min {min(samples):.1f}, {args.repeats} x {args.requests})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
