"""What a KEP-6060 caller-token check costs per review, side by side in one run.

Run by hand: ``.venv/bin/python bench/callertoken.py``. Builds Envelope's app (default
rules and policy, empty cluster view) three times — without ``--caller-token``, with
``enforce`` and with ``warn`` — and drives ``POST /validate`` and ``/mutate`` through
the raw ASGI interface (no sockets, no TLS: the part the check adds, not the network),
with a Deployment review and a token minted for the path (RS256, 2048-bit key, claims
as kube-apiserver v1.37.2 issues them). Also times ``verify`` alone (the first request
of each token; later ones hit the per-token cache) for RS256 and ES256.

Reports CPU microseconds per review (``time.process_time``, so a busy machine stretches
wall time, not these) and the ratio to the run without the check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import jwt  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: E402
from webhook import deployment  # noqa: E402

from app.core.config import Policy  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402
from app.serve.callerauth import CallerCheck, KeySource, verify  # noqa: E402
from app.serve.server import Metrics, create_app  # noqa: E402

ISSUER = "https://kubernetes.default.svc"
BASE = "https://envelope.envelope.svc:443"


def _jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
    public = json.loads(algorithm.to_jwk(key.public_key()))
    public.update(kid=kid, alg=alg, use="sig")
    return public


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
CONFIGS = {
    resource: {"metadata": {"name": "envelope", "uid": f"uid-{resource}"},
               "webhooks": [{"clientConfig": {"service": {"name": "envelope", "namespace": "envelope",
                                                          "path": path}}}]}
    for resource, path in (("validatingwebhookconfigurations", "/validate"),
                           ("mutatingwebhookconfigurations", "/mutate"))}


def get(path: str, accept: str) -> dict[str, Any]:
    if path == "/.well-known/openid-configuration":
        return {"issuer": ISSUER}
    if path == "/openid/v1/jwks":
        return {"keys": [_jwk(RSA_KEY, "r", "RS256"), _jwk(EC_KEY, "e", "ES256")]}
    return CONFIGS[path.rsplit("/", 2)[-2]]


def token(path: str, key: Any = RSA_KEY, kid: str = "r", alg: str = "RS256", jti: int = 0) -> str:
    resource = "validatingwebhookconfiguration" if path == "/validate" else "mutatingwebhookconfiguration"
    now = int(time.time())
    return jwt.encode({"iss": ISSUER, "sub": "system:serviceaccount:kube-system:kube-apiserver",
                       "aud": [BASE + path], "iat": now, "nbf": now, "exp": now + 600, "jti": str(jti),
                       "kubernetes.io": {resource: {"name": "envelope", "uid": f"uid-{resource}s"},
                                         "attestations": {"admissionReviewAPIGroups": ["*"]}}},
                      key, algorithm=alg, headers={"kid": kid})


def review() -> bytes:
    obj = deployment()
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "operation": "CREATE",
                                   "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                                   "resource": {"group": "apps", "version": "v1",
                                                "resource": "deployments"},
                                   "namespace": obj["metadata"]["namespace"], "object": obj}}).encode()


async def drive(app: Any, path: str, body: bytes, headers: list[tuple[bytes, bytes]], n: int) -> float:
    """CPU seconds for n reviews through the ASGI app; asserts each is answered 200."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode()), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8443)}
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.process_time()
    for _ in range(n):
        await app(dict(scope), receive, send)
    spent = time.process_time() - started
    assert set(statuses) == {200}, set(statuses)
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=3000, help="reviews per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rules, body = default_ruleset(), review()
    apps: dict[str, Any] = {"off": create_app(rules, Policy(), metrics=Metrics())}
    for mode in ("enforce", "warn"):
        source = KeySource(get, [(r, "envelope") for r in CONFIGS])
        assert source.refresh() is not None, source.problem
        apps[mode] = create_app(rules, Policy(), metrics=Metrics(), caller=CallerCheck(mode, source))  # type: ignore[arg-type]
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for path in ("/validate", "/mutate"):
            tokens = {"off": [], "enforce": [(b"authorization", f"Bearer {token(path)}".encode())],
                      "warn": []}  # warn: no token at all (what a 1.37 API server sends)
            for mode, app in apps.items():
                spent = asyncio.run(drive(app, path, body, tokens[mode], args.n))
                results.setdefault(path, {}).setdefault(mode, []).append(spent / args.n * 1e6)
    source = KeySource(get, [(r, "envelope") for r in CONFIGS])
    trust = source.refresh()
    assert trust is not None
    first: dict[str, float] = {}
    for alg, key, kid in (("RS256", RSA_KEY, "r"), ("ES256", EC_KEY, "e")):
        minted = [token("/validate", key, kid, alg, jti=i) for i in range(300)]
        started = time.process_time()
        for t in minted:
            verify(t, "/validate", trust)
        first[alg] = (time.process_time() - started) / len(minted) * 1e6
    print(f"CPU µs per review (best of {args.rounds} rounds of {args.n}; ratio to no check)")
    for path, modes in results.items():
        base = min(modes["off"])
        print(f"  {path:9} " + "  ".join(
            f"{mode}: {min(v):7.1f} ({min(v) / base:4.2f}x)" for mode, v in modes.items()))
    print("verify() on a token not seen before (signature + claims), CPU µs: "
          + ", ".join(f"{alg} {us:.0f}" for alg, us in first.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
