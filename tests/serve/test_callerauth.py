"""KEP-6060 caller tokens (app/serve/callerauth.py): the checks on tokens signed by keys made
here, shaped as kube-apiserver v1.37.2 issues them (pkg/serviceaccount/claims.go). The
same checks on tokens the real API server mints are in e2e/test_caller_token.py."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from app.core.config import Policy
from app.serve.callerauth import (
    Binding,
    CallerCheck,
    CallerTokenError,
    KeySource,
    Trust,
    audience_of,
    bearer,
    bindings_of,
    verify,
)
from app.serve.server import Metrics, create_app
from tests.conftest import RULES

ISSUER = "https://kubernetes.default.svc"
BASE = "https://envelope.envelope.svc:443"
VUID, MUID = "0b1c-validating", "7f2e-mutating"


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY, OTHER = _rsa(), _rsa()
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def _jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
    public = json.loads(algorithm.to_jwk(key.public_key()))
    public.update(kid=kid, alg=alg, use="sig")
    return public


def _configs(vuid: str = VUID) -> dict[str, dict[str, Any]]:
    service = {"name": "envelope", "namespace": "envelope", "port": 443}
    return {
        "validatingwebhookconfigurations": {
            "metadata": {"name": "envelope", "uid": vuid},
            "webhooks": [{"name": "v.envelope.io",
                          "clientConfig": {"service": {**service, "path": "/validate"}}}]},
        "mutatingwebhookconfigurations": {
            "metadata": {"name": "envelope", "uid": MUID},
            "webhooks": [{"name": "m.envelope.io",
                          "clientConfig": {"service": {**service, "path": "/mutate"}}}]},
    }


class Api:
    """What KeySource reads, as the API server answers it: discovery, JWKS, configurations."""

    def __init__(self) -> None:
        self.keys = [_jwk(KEY, "k1", "RS256"), _jwk(EC_KEY, "e1", "ES256")]
        self.configs = _configs()
        self.reads = 0

    def get(self, path: str, accept: str) -> dict[str, Any]:
        self.reads += path == "/openid/v1/jwks"
        # as kube-apiserver: the JWKS is served as application/jwk-set+json only (406 else)
        assert (accept == "application/jwk-set+json") == (path == "/openid/v1/jwks"), path
        if path == "/.well-known/openid-configuration":
            return {"issuer": ISSUER, "jwks_uri": f"{ISSUER}/openid/v1/jwks",
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"]}
        if path == "/openid/v1/jwks":
            return {"keys": self.keys}
        resource, name = path.rsplit("/", 2)[-2:]
        assert name == "envelope", path
        return self.configs[resource]


def _source(api: Api | None = None) -> KeySource:
    source = KeySource((api or Api()).get, [("mutatingwebhookconfigurations", "envelope"),
                                            ("validatingwebhookconfigurations", "envelope")])
    assert source.refresh() is not None, source.problem
    return source


def _trust() -> Trust:
    trust = _source().trust
    assert trust is not None
    return trust


def claims(*, claim: str = "validatingwebhookconfiguration", name: str = "envelope",
           uid: str = VUID, group: Any = "*", aud: Any = f"{BASE}/validate",
           iss: str = ISSUER, exp: float | None = None, nbf: float | None = None,
           drop: tuple[str, ...] = ()) -> dict[str, Any]:
    now = time.time()
    private: dict[str, Any] = {"namespace": "kube-system",
                               "serviceaccount": {"name": "kube-apiserver", "uid": "sa-1"},
                               claim: {"name": name, "uid": uid}}
    if group is not None:
        private["attestations"] = {"admissionReviewAPIGroups": group if isinstance(group, list)
                                   else [group]}
    body = {"iss": iss, "sub": "system:serviceaccount:kube-system:kube-apiserver",
            "aud": aud if isinstance(aud, list) else [aud], "iat": int(now),
            "nbf": int(now if nbf is None else nbf), "exp": int(now + 600 if exp is None else exp),
            "kubernetes.io": private}
    for key in drop:
        body.pop(key, None)
    return body


def sign(body: dict[str, Any], key: Any = KEY, kid: str | None = "k1", alg: str = "RS256") -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def reason(token: str, path: str = "/validate", trust: Trust | None = None) -> str:
    try:
        verify(token, path, trust or _trust())
    except CallerTokenError as exc:
        return exc.reason
    return "valid"


# ------------------------------------------------------------------- the claims


def test_a_token_bound_to_our_configuration_passes() -> None:
    trust = _trust()
    caller = verify(sign(claims()), "/validate", trust)
    assert (caller.claim, caller.name, caller.uid, caller.group) == (
        "validatingwebhookconfiguration", "envelope", VUID, "*")
    assert caller.subject == "system:serviceaccount:kube-system:kube-apiserver"
    assert caller.allows("apps") and caller.allows("")
    mutating = claims(claim="mutatingwebhookconfiguration", uid=MUID, aud=f"{BASE}/mutate")
    assert reason(sign(mutating), "/mutate") == "valid"
    assert reason(sign(claims(), EC_KEY, "e1", "ES256")) == "valid"


def test_the_attested_group_must_cover_the_review() -> None:
    caller = verify(sign(claims(group="apps")), "/validate", _trust())
    assert caller.allows("apps")
    assert not caller.allows("") and not caller.allows("batch")


@pytest.mark.parametrize(("body", "expected"), [
    (claims(exp=time.time() - 120), "expired"),
    (claims(nbf=time.time() + 600), "not-yet-valid"),
    (claims(iss="https://other.example"), "issuer"),
    (claims(aud=f"{BASE}/mutate"), "audience"),
    (claims(aud="https://envelope.envelope.svc/validate"), "audience"),  # port is part of it
    (claims(aud="kubernetes.default.svc"), "audience"),
    (claims(name="kyverno-resource-validating-webhook-cfg"), "configuration"),
    (claims(claim="mutatingwebhookconfiguration", uid=MUID), "configuration"),  # on /validate
    (claims(uid="an-older-uid"), "configuration-uid"),
    (claims(group=None), "api-group"),
    (claims(group=["apps", "batch"]), "api-group"),
    (claims(group=""), "api-group"),
    (claims(drop=("exp",)), "malformed"),
    (claims(drop=("sub",)), "malformed"),
])
def test_each_claim_is_checked(body: dict[str, Any], expected: str) -> None:
    assert reason(sign(body)) == expected


def test_a_token_within_the_leeway_still_passes() -> None:
    # go-jose's DefaultLeeway (one minute), as the API server's own validator
    assert reason(sign(claims(exp=time.time() - 30))) == "valid"
    assert reason(sign(claims(nbf=time.time() + 30))) == "valid"


def test_tokens_not_bound_to_a_webhook_configuration_are_refused() -> None:
    pod_bound = claims()
    private = pod_bound["kubernetes.io"]
    del private["validatingwebhookconfiguration"]
    private["pod"] = {"name": "p", "uid": "1"}
    assert reason(sign(pod_bound)) == "not-webhook-bound"
    both = claims()
    both["kubernetes.io"]["mutatingwebhookconfiguration"] = {"name": "envelope", "uid": MUID}
    assert reason(sign(both)) == "not-webhook-bound"
    assert reason(sign({k: v for k, v in claims().items() if k != "kubernetes.io"})) == \
        "not-webhook-bound"
    weird = claims()
    weird["kubernetes.io"]["validatingwebhookconfiguration"] = "envelope"
    assert reason(sign(weird)) == "not-webhook-bound"


def test_signatures_and_algorithms() -> None:
    assert reason(sign(claims(), OTHER, "k1")) == "signature"  # right kid, wrong key
    assert reason(sign(claims(), OTHER, "k9")) == "unknown-key"
    assert reason(sign(claims(), kid=None)) == "unknown-key"  # two keys published: kid needed
    # ES256 key id with an RS256 signature: the JWK says which algorithm its key signs
    assert reason(sign(claims(), KEY, "e1", "RS256")) == "algorithm"
    # alg none, and HS256 keyed with the public key (the classic confusion)
    unsigned = jwt.encode(claims(), None, algorithm="none", headers={"kid": "k1"})
    assert reason(unsigned) == "algorithm"
    header, payload, _ = sign(claims()).split(".")
    assert reason(f"{header}.{payload}.") == "signature"
    assert reason("not.a.jwt") == "malformed"
    assert reason("") == "malformed"
    # a payload altered after signing
    import base64
    forged = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged["kubernetes.io"]["attestations"]["admissionReviewAPIGroups"] = ["*"]
    forged["aud"] = ["https://evil.example/validate"]
    encoded = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    assert reason(f"{header}.{encoded}.{sign(claims()).split('.')[2]}") == "signature"


def test_a_single_published_key_serves_tokens_without_a_kid() -> None:
    api = Api()
    api.keys = [_jwk(KEY, "k1", "RS256")]
    trust = _source(api).trust
    assert trust is not None
    assert reason(sign(claims(), kid=None), trust=trust) == "valid"


# ----------------------------------------------------------- webhook addresses


@pytest.mark.parametrize(("client_config", "audience"), [
    # k8s.io/kubernetes v1.37.2 validateWebhookAudience: URL verbatim ...
    ({"url": "https://127.0.0.1:8443/validate"}, "https://127.0.0.1:8443/validate"),
    ({"url": "https://hooks.example.com/x/"}, "https://hooks.example.com/x/"),
    # ... or https://$name.$namespace.svc:$port$path, port 443 and path "/" by default
    ({"service": {"name": "e", "namespace": "n"}}, "https://e.n.svc:443/"),
    ({"service": {"name": "e", "namespace": "n", "port": 8443, "path": "validate"}},
     "https://e.n.svc:8443/validate"),
    ({"service": {"name": "e", "namespace": "n", "path": "/mutate/"}}, "https://e.n.svc:443/mutate/"),
    ({"service": {"name": "e"}}, None),
    ({}, None),
])
def test_audience_as_the_api_server_derives_it(client_config: dict[str, Any],
                                               audience: str | None) -> None:
    assert audience_of(client_config) == audience


def test_url_paths_are_compared_as_the_server_sees_them() -> None:
    config = {"metadata": {"name": "e", "uid": "u"},
              "webhooks": [{"clientConfig": {"url": "https://10.0.0.1/va%6Cidate"}}]}
    assert set(bindings_of("validatingwebhookconfigurations", config)) == {"/validate"}


def test_bindings_follow_the_paths_of_our_webhooks() -> None:
    config = {"metadata": {"name": "envelope", "uid": "u"},
              "webhooks": [{"clientConfig": {"service": {"name": "e", "namespace": "n",
                                                         "path": "/validate"}}},
                           {"clientConfig": {"url": "https://10.0.0.1:9443/validate"}},
                           {"clientConfig": {"service": {"name": "e", "namespace": "n",
                                                         "path": "/validate-actors"}}},
                           "junk", {"clientConfig": 7}]}
    got = bindings_of("validatingwebhookconfigurations", config)
    assert got == {
        "/validate": Binding("validatingwebhookconfiguration", "envelope", "u",
                             frozenset({"https://e.n.svc:443/validate",
                                        "https://10.0.0.1:9443/validate"})),
        "/validate-actors": Binding("validatingwebhookconfiguration", "envelope", "u",
                                    frozenset({"https://e.n.svc:443/validate-actors"}))}
    assert bindings_of("validatingwebhookconfigurations", {"metadata": {}}) == {}


# ------------------------------------------------------------- the header


@pytest.mark.parametrize(("headers", "expected"), [
    ([], None),
    ([(b"authorization", b"Bearer abc.def.ghi")], "abc.def.ghi"),
    ([(b"authorization", b"bearer   abc")], "abc"),
    ([(b"authorization", b"Basic dXNlcjpwYXNz")], "malformed"),
    ([(b"authorization", b"Bearer")], "malformed"),
    ([(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")], "malformed"),
    ([(b"authorization", b"Bearer " + b"a" * 20000)], "malformed"),
    ([(b"authorization", b"Bearer \xff\xfe")], "malformed"),
])
def test_bearer_header(headers: list[tuple[bytes, bytes]], expected: str | None) -> None:
    try:
        got: str | None = bearer(headers)
    except CallerTokenError as exc:
        got = exc.reason
    assert got == expected


# ------------------------------------------------- source, cache and refresh


def test_keys_that_rotate_are_read_again_at_most_every_ten_seconds() -> None:
    api = Api()
    source = _source(api)
    check = CallerCheck("enforce", source)
    counted: list[str] = []
    check.count = counted.append
    new_key = _rsa()
    api.keys = [*api.keys, _jwk(new_key, "k2", "RS256")]
    source._last = float("-inf")  # the start-up read was long ago
    reads = api.reads
    headers = [(b"authorization", f"Bearer {sign(claims(), new_key, 'k2')}".encode())]
    result = asyncio.run(check.check(headers, "/validate"))
    assert not isinstance(result, CallerTokenError), result
    assert api.reads == reads + 1
    # a flood of unknown key ids costs one read per ten seconds, not one per request
    bogus = [(b"authorization", f"Bearer {sign(claims(), OTHER, 'k-unknown')}".encode())]
    for _ in range(20):
        refused = asyncio.run(check.check(bogus, "/validate"))
        assert isinstance(refused, CallerTokenError) and refused.reason == "unknown-key"
    assert api.reads == reads + 1
    # "valid" is counted once the review's groups are known (CallerCheck.judged)
    assert counted == ["unknown-key"] * 20


def test_a_rate_limited_read_never_waits_for_one_under_way() -> None:
    api = Api()
    source = _source(api)
    kept = source.trust
    source._last = float("-inf")
    source._lock.acquire()  # a read is under way (slow API server)
    try:
        started = time.monotonic()
        assert source.refresh(soon=True) is kept
        assert time.monotonic() - started < 0.5
    finally:
        source._lock.release()


def test_a_deleted_configuration_binds_nothing_and_the_keys_still_rotate() -> None:
    api = Api()
    source = _source(api)
    new_key = _rsa()
    api.keys = [_jwk(new_key, "k2", "RS256")]  # k1 dropped, k2 added
    deleted = dict(api.configs)
    del deleted["mutatingwebhookconfigurations"]

    def get(path: str, accept: str) -> dict[str, Any]:
        if "mutatingwebhookconfigurations" in path:
            from app.cluster.kube import ApiError
            raise ApiError(404, "not found")
        return api.get(path, accept)

    source.get = get
    trust = source.refresh()
    assert trust is not None and set(trust.keys) == {"k2"} and set(trust.routes) == {"/validate"}
    assert trust.missing == ("mutatingwebhookconfigurations/envelope",)  # read again in 5 s
    assert reason(sign(claims()), trust=trust) == "unknown-key"  # the dropped key
    assert reason(sign(claims(), new_key, "k2"), trust=trust) == "valid"
    mutating = claims(claim="mutatingwebhookconfiguration", uid=MUID, aud=f"{BASE}/mutate")
    assert reason(sign(mutating, new_key, "k2"), "/mutate", trust) == "configuration"
    # and one being deleted binds nothing either (the API server's validator refuses it too)
    dying = _configs()["validatingwebhookconfigurations"]
    dying["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert bindings_of("validatingwebhookconfigurations", dying) == {}


def test_keys_not_read_for_long_make_the_server_not_ready() -> None:
    import dataclasses

    from app.serve.callerauth import STALE
    source = _source()
    assert source.problems() == []
    assert source.trust is not None
    source.trust = dataclasses.replace(source.trust, loaded=time.time() - STALE - 1)
    source.problem = "cannot read the API server's keys or our configurations: timeout"
    assert "last read" in source.problems()[0] and "timeout" in source.problems()[0]


def test_a_recreated_configuration_invalidates_remembered_tokens() -> None:
    api = Api()
    source = _source(api)
    check = CallerCheck("enforce", source)
    headers = [(b"authorization", f"Bearer {sign(claims())}".encode())]
    assert not isinstance(asyncio.run(check.check(headers, "/validate")), CallerTokenError)
    api.configs = _configs(vuid="a-new-uid")  # deleted and created again
    source._last = float("-inf")
    # The first token minted for the new configuration makes Envelope read it again ...
    fresh = [(b"authorization", f"Bearer {sign(claims(uid='a-new-uid'))}".encode())]
    assert not isinstance(asyncio.run(check.check(fresh, "/validate")), CallerTokenError)
    # ... and from then on the old configuration's tokens, remembered or not, are refused
    refused = asyncio.run(check.check(headers, "/validate"))
    assert isinstance(refused, CallerTokenError) and refused.reason == "configuration-uid"


def test_a_read_that_fails_keeps_the_keys_in_use() -> None:
    api = Api()
    source = _source(api)
    kept = source.trust
    api.keys = []
    assert source.refresh() is kept and source.problem and not source.problems()
    empty = KeySource(api.get, [("validatingwebhookconfigurations", "envelope")])
    assert empty.refresh() is None
    assert "no usable key" in empty.problems()[0]


# --------------------------------------------------------- through the app


def _review(group: str = "", kind: str = "Pod") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "operation": "CREATE",
                                   "kind": {"group": group, "version": "v1", "kind": kind},
                                   "resource": {"group": group, "version": "v1",
                                                "resource": kind.lower() + "s"},
                                   "namespace": "default",
                                   "object": {"apiVersion": f"{group}/v1" if group else "v1",
                                              "kind": kind, "metadata": {"name": "x"}}}}).encode()


def _post(mode: str, path: str, token: str | None, body: bytes) -> tuple[httpx.Response, str]:
    metrics = Metrics()
    app = create_app(RULES, Policy(), metrics=metrics, caller=CallerCheck(mode, _source()))  # type: ignore[arg-type]
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(path, content=body, headers=headers)

    from prometheus_client import generate_latest
    response = asyncio.run(call())
    return response, generate_latest(metrics.registry).decode()


def test_enforce_refuses_before_reading_the_review() -> None:
    response, metrics = _post("enforce", "/validate", None, b"not even json")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="envelope"'
    assert "caller token refused (missing)" in response.json()["error"]
    assert 'envelope_caller_tokens_total{mode="enforce",result="missing"} 1.0' in metrics
    # counted with the other refused requests, as every 4xx
    assert ('envelope_admission_requests_total{decision="malformed",endpoint="validate",'
            'kind="other",operation=""} 1.0') in metrics
    response, _ = _post("enforce", "/mutate", sign(claims()), _review())
    assert response.status_code == 401
    assert "(configuration)" in response.json()["error"]


def test_enforce_serves_a_good_token_and_checks_its_group() -> None:
    # The core group cannot be attested by name (TokenRequest validation refuses ""),
    # so a webhook on Pods needs a "*" token.
    response, metrics = _post("enforce", "/validate", sign(claims(group="*")), _review())
    assert response.status_code == 200, response.text
    assert response.json()["response"]["uid"] == "u-1"
    assert 'envelope_caller_tokens_total{mode="enforce",result="valid"} 1.0' in metrics
    response, _ = _post("enforce", "/validate", sign(claims(group="apps")), _review())
    assert response.status_code == 403
    assert "attests API group 'apps', this review is for 'core'" in response.json()["error"]
    response, _ = _post("enforce", "/validate", sign(claims(group="apps")),
                        _review("apps", "Deployment"))
    assert response.status_code == 200


def test_warn_mode_answers_and_counts() -> None:
    response, metrics = _post("warn", "/validate", None, _review())
    assert response.status_code == 200 and response.json()["response"]["uid"] == "u-1"
    assert 'envelope_caller_tokens_total{mode="warn",result="missing"} 1.0' in metrics
    response, metrics = _post("warn", "/validate", sign(claims(group="apps")), _review())
    assert response.status_code == 200
    assert 'envelope_caller_tokens_total{mode="warn",result="api-group"} 1.0' in metrics
    assert 'envelope_caller_tokens_total{mode="warn",result="valid"} 0.0' in metrics  # once each


def test_the_kind_and_the_resource_group_must_both_be_attested() -> None:
    # Both come from the sender; the rules are chosen by the kind's group.
    body = json.loads(_review("apps", "Deployment"))
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    response, _ = _post("enforce", "/validate", sign(claims(group="apps")), json.dumps(body).encode())
    assert response.status_code == 403, response.text
    assert "this review is for 'core'" in response.json()["error"]


def test_a_good_token_with_a_bad_body_is_counted_once_as_valid() -> None:
    for body, status in ((b"{}", 400), (b"x" * 10, 400)):
        response, metrics = _post("enforce", "/validate", sign(claims()), body)
        assert response.status_code == status
        assert 'envelope_caller_tokens_total{mode="enforce",result="valid"} 1.0' in metrics


def test_before_the_keys_are_read_the_answer_holds_no_server_detail() -> None:
    api = Api()
    source = KeySource(api.get, [("validatingwebhookconfigurations", "envelope")])
    source.problem = "cannot read ...: HTTP 403: secret internal text"
    app = create_app(RULES, Policy(), caller=CallerCheck("enforce", source))

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/validate", content=_review(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {sign(claims())}"})

    response = asyncio.run(call())
    assert response.status_code == 401 and "(no-keys)" in response.json()["error"]
    assert "secret internal text" not in response.text
