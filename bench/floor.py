"""The benchmarks' floor: Envelope's own app (FastAPI, the raw review endpoint, TLS
1.2+, uvicorn) with three more review routes that skip the rules.

- ``/floor``: read the body, answer an allow for its uid (found by a regex, not by
  decoding) — uvicorn + TLS + HTTP alone;
- ``/floor-patch``: the same, answering with a one-op JSON patch — what a mutating
  answer costs the API server, apart from any rule;
- ``/floor-envpatch``: the same, answering with the patch (and the warning) Envelope
  answers for bench/peers/objects.py's timed Deployment, computed once at start — what
  Envelope's patch costs the API server, apart from Envelope computing it (send only
  that object: the patch names its containers' paths);
- ``/floor-decode``: the floor plus what every review does before its rules — the body
  decoded and checked as an AdmissionReview, an allow encoded as a review does it.

``/mutate`` and ``/validate`` are Envelope's, unchanged. Run as
``python bench/floor.py --host H --port P --cert-file C --key-file K`` (the serving
flags of ``envelope serve``; others are accepted and ignored). Never part of
``envelope serve``: benchmark code stays out of the product.
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
from fastapi import FastAPI
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.config import Policy
from app.core.ruleset import default_ruleset
from app.serve.admission import BadReview, Decision, parse_review, review_response
from app.serve.server import ReviewEndpoint, create_app

IDLE_SECONDS = 120
"""Longer than the API server keeps an idle webhook connection (90 s, http.DefaultTransport
via k8s.io/client-go transport/cache.go), so it never reuses one this server just closed:
with uvicorn's 5 s some creates failed with "failed calling webhook: EOF"."""
_UID = re.compile(rb'"uid"\s*:\s*"([^"]*)"')
_PATCH = base64.b64encode(orjson.dumps(
    [{"op": "add", "path": "/metadata/annotations", "value": {"envelope.io/floor": "1"}}]))


_UID_SLOT = "00000000-0000-0000-0000-uid-slot-0000"


def _envelope_answer() -> tuple[bytes, bytes]:
    """Envelope's answer to the timed Deployment of the API-server bench (patch and
    warning, encoded as /mutate encodes it), split around the uid."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
    from objects import timed_deployment

    from app.cluster.view import StaticView
    from app.core.engine import evaluate
    from app.core.frontdoor import subject_of
    from app.serve.admission import decide

    obj = timed_deployment()
    # As bench/apiserver.py sends it: its own metadata (name, namespace, labels only).
    obj["metadata"] = {"name": "bench-0", "namespace": "bench", "labels": obj["metadata"]["labels"]}
    result = evaluate(default_ruleset(), subject_of(obj), StaticView(), Policy(), "mutate")
    head, _, tail = review_response(_UID_SLOT, decide(result, "deny")).partition(_UID_SLOT.encode())
    return head, tail


_ENVELOPE_ANSWER = _envelope_answer()


def _uid(body: bytes) -> bytes:
    found = _UID.search(body)
    return found.group(1) if found else b""


def floor(body: bytes) -> tuple[int, bytes]:
    return 200, (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
                 b'"response":{"uid":"' + _uid(body) + b'","allowed":true}}')


def floor_patch(body: bytes) -> tuple[int, bytes]:
    return 200, (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
                 b'"response":{"uid":"' + _uid(body) + b'","allowed":true,'
                 b'"patchType":"JSONPatch","patch":"' + _PATCH + b'"}}')


def floor_envpatch(body: bytes) -> tuple[int, bytes]:
    return 200, _ENVELOPE_ANSWER[0] + _uid(body) + _ENVELOPE_ANSWER[1]


def floor_decode(body: bytes) -> tuple[int, bytes]:
    try:
        uid, _ = parse_review(body)
    except BadReview as exc:
        return 400, orjson.dumps({"error": f"not an AdmissionReview: {exc}"})
    return 200, review_response(uid, Decision(True))


class Floor:
    """A floor as the server's ``Service``: the answer is made from the body as
    ``decode`` gets it; there is never a request to answer."""

    def __init__(self, make: Callable[[bytes], tuple[int, bytes]]) -> None:
        self.make = make

    def decode(self, body: bytes) -> tuple[int, bytes]:
        return self.make(body)

    def answer(self, request: object) -> tuple[int, bytes]:
        raise AssertionError("a floor decodes no request")


FLOOR_ROUTES: dict[str, Callable[[bytes], tuple[int, bytes]]] = {"/floor": floor, "/floor-patch": floor_patch,
                                    "/floor-envpatch": floor_envpatch, "/floor-decode": floor_decode}


def floor_app(nodes: int = 0) -> FastAPI:
    """Envelope's app (default rules and policy; a cluster view of ``nodes`` Nodes shaped
    as in bench/pod_fits_node.py, empty by default) plus the floors."""
    rules = default_ruleset()
    view = None
    if nodes:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from pod_fits_node import nodes as bench_nodes

        from app.cluster.view import StaticView

        view = StaticView(bench_nodes(nodes), rules.indexes)
    app = create_app(rules, Policy(), view)
    for path, handler in FLOOR_ROUTES.items():
        app.router.routes.append(Route(path, ReviewEndpoint(Floor(handler))))
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from app.serve.logs import setup_logging
    from app.serve.tls import KeyPair, TlsState

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", nargs="?", default="serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--nodes", type=int, default=0, help="Nodes in the cluster view (bench only)")
    args, _ = parser.parse_known_args(argv)
    setup_logging(args.log_level)
    state = TlsState()
    if not state.load(KeyPair(Path(args.cert_file).read_bytes(), Path(args.key_file).read_bytes())):
        print("floor: cannot load the certificate", file=sys.stderr)
        return 2
    config = uvicorn.Config(floor_app(args.nodes), host=args.host, port=args.port, log_config=None,
                            access_log=False, server_header=False,
                            timeout_keep_alive=IDLE_SECONDS)
    config.load()
    config.ssl = state.context
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
