"""Caller tokens (KEP-6060): only the API server, holding a token bound to one of our
webhook configurations, may ask for a review.

Kubernetes 1.37 (alpha, ``APIServerWebhookAuthenticationToken``) issues service-account
tokens bound to a Validating- or MutatingWebhookConfiguration. This checks what
kube-apiserver v1.37.2 puts in them (``pkg/serviceaccount/claims.go``,
``pkg/registry/core/serviceaccount/storage/token.go``): the signature against the API
server's JWKS and issuer, ``exp``/``nbf``, ``aud`` (our webhook's address as the API
server derives it), the configuration's name and uid, and the attested API groups
against the review. Issuer, keys and configurations are re-read in the background (and
on an unknown key or uid, at most every ten seconds); a token that passed is remembered
until it expires. Each claim, how tokens are delivered today and the modes:
docs/security.md, "Who can call it".

Why one module of ~470 lines: parsing a token, its binding to our two configurations,
the key sources and the per-request check are one protocol (KEP-6060), and every way it
refuses is one of ``REASONS``, counted in one place (``CallerCheck.settle``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import jwt
from jwt.exceptions import (
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidIssuerError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
    PyJWKError,
)

__all__ = ["ALGORITHMS", "LEEWAY", "REASONS", "Binding", "Caller", "CallerCheck", "CallerTokenError",
           "KeySource", "Trust", "audience_of", "bearer", "bindings_of", "path_of", "verify"]

log = logging.getLogger("envelope.callerauth")

Mode = Literal["warn", "enforce"]

ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
"""Asymmetric only: the API server signs service-account tokens with an RSA or ECDSA
key. ``none`` and the HMAC algorithms are never accepted."""

LEEWAY = 60.0
"""Seconds of clock skew allowed on ``exp``/``nbf`` (the API server's validator uses
go-jose's ``DefaultLeeway``, one minute)."""

REFRESH = 300.0
"""Seconds between background reads of the issuer, the keys and our configurations."""

STALE = 3 * REFRESH
"""Older than this, the keys in use make the server not ready (enforce mode)."""

MIN_REFRESH = 10.0
"""A token naming an unknown key or configuration uid triggers a read at most this often."""

MAX_TOKEN_BYTES = 16 * 1024
CACHE_SIZE = 256

REASONS = ("valid", "missing", "malformed", "algorithm", "unknown-key", "signature", "issuer",
           "expired", "not-yet-valid", "audience", "not-webhook-bound", "configuration",
           "configuration-uid", "api-group", "no-keys")
"""Every value of the ``result`` label of ``envelope_caller_tokens_total``."""

KINDS = {"validatingwebhookconfigurations": "validatingwebhookconfiguration",
         "mutatingwebhookconfigurations": "mutatingwebhookconfiguration"}
"""Our configuration resources -> the private claim the API server binds a token with."""


class CallerTokenError(Exception):
    """A token that does not let its bearer ask; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Binding:
    """One of our configurations and the audiences of its webhooks that route to a path."""

    claim: str
    """``validatingwebhookconfiguration`` or ``mutatingwebhookconfiguration``."""
    name: str
    uid: str
    audiences: frozenset[str]


@dataclass(frozen=True)
class Trust:
    """What tokens are checked against: one snapshot, swapped whole."""

    issuer: str
    keys: Mapping[str, Any]
    """kid -> PyJWK (a key without a kid is filed under "")."""
    routes: Mapping[str, tuple[Binding, ...]]
    """request path -> the bindings whose webhooks are called on it."""
    loaded: float = 0.0
    """When it was read (Unix time)."""
    missing: tuple[str, ...] = ()
    """Our configurations the API server did not have (read again every few seconds)."""


@dataclass(frozen=True)
class Caller:
    """A verified token: who, bound to what, for which API group, until when."""

    subject: str
    claim: str
    name: str
    uid: str
    audiences: tuple[str, ...]
    group: str
    expires: float

    def allows(self, group: str) -> bool:
        return self.group == "*" or self.group == group


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of an ASGI header list; ``None`` without one. More than one
    Authorization header, or another scheme, is an error."""
    found: list[bytes] = [value for name, value in headers if name == b"authorization"]
    if not found:
        return None
    if len(found) > 1:
        raise CallerTokenError("malformed", "more than one Authorization header")
    scheme, _, token = found[0].strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        raise CallerTokenError("malformed", "the Authorization header is not 'Bearer <token>'")
    if len(token) > MAX_TOKEN_BYTES:
        raise CallerTokenError("malformed", f"token longer than {MAX_TOKEN_BYTES} bytes")
    try:
        return token.strip().decode("ascii")
    except UnicodeDecodeError:
        raise CallerTokenError("malformed", "token is not ASCII") from None


def path_of(client_config: Mapping[str, Any]) -> str | None:
    """The request path the API server calls a webhook on (None: not one we can tell)."""
    url = client_config.get("url")
    if isinstance(url, str) and url:  # decoded, as the ASGI scope's path
        return urllib.parse.unquote(urllib.parse.urlsplit(url).path) or "/"
    service = client_config.get("service")
    if isinstance(service, Mapping):
        path = service.get("path")
        path = path if isinstance(path, str) and path else "/"
        return path if path.startswith("/") else "/" + path
    return None


def audience_of(client_config: Mapping[str, Any]) -> str | None:
    """The audience the API server requires of a token for this webhook (k8s.io/kubernetes
    v1.37.2 ``validateWebhookAudience``): the URL verbatim, or
    ``https://<name>.<namespace>.svc:<port><path>`` with port 443 and path ``/`` by default."""
    url = client_config.get("url")
    if isinstance(url, str) and url:
        return url
    service = client_config.get("service")
    if not isinstance(service, Mapping):
        return None
    name, namespace = service.get("name"), service.get("namespace")
    if not (isinstance(name, str) and isinstance(namespace, str) and name and namespace):
        return None
    port = service.get("port")
    port = port if isinstance(port, int) and not isinstance(port, bool) else 443
    return f"https://{name}.{namespace}.svc:{port}{path_of(client_config)}"


def bindings_of(resource: str, config: Mapping[str, Any]) -> dict[str, Binding]:
    """path -> Binding for one webhook configuration object as the API server returns it."""
    meta = config.get("metadata") or {}
    name, uid = meta.get("name"), meta.get("uid")
    if not (isinstance(name, str) and isinstance(uid, str)) or meta.get("deletionTimestamp"):
        return {}  # a configuration being deleted binds no token (as the API server's validator)
    audiences: dict[str, set[str]] = {}
    webhooks = config.get("webhooks")
    for hook in webhooks if isinstance(webhooks, list) else ():
        client_config = hook.get("clientConfig") if isinstance(hook, Mapping) else None
        if not isinstance(client_config, Mapping):
            continue
        path, audience = path_of(client_config), audience_of(client_config)
        if path is not None and audience is not None:
            audiences.setdefault(path, set()).add(audience)
    return {path: Binding(KINDS[resource], name, uid, frozenset(auds))
            for path, auds in audiences.items()}


def _claims(token: str, trust: Trust) -> tuple[dict[str, Any], str]:
    """Signature, issuer and times checked; the payload and the key id used."""
    try:
        header = jwt.get_unverified_header(token)
    except InvalidTokenError:
        raise CallerTokenError("malformed", "not a JWT") from None
    alg, kid = header.get("alg"), header.get("kid", "")
    if alg not in ALGORITHMS:
        raise CallerTokenError("algorithm", f"signing algorithm {str(alg)[:20]!r} is not one of "
                                            f"{', '.join(ALGORITHMS)}")
    if not isinstance(kid, str):
        raise CallerTokenError("malformed", "kid is not a string")
    key = trust.keys.get(kid)
    if key is None and not kid and len(trust.keys) == 1:
        key = next(iter(trust.keys.values()))
    if key is None:
        raise CallerTokenError("unknown-key", f"key id {kid[:64]!r} is not in the API server's "
                                              f"JWKS")
    if getattr(key, "algorithm_name", alg) != alg:
        raise CallerTokenError("algorithm", f"signed with {alg} by a key published for "
                                            f"{key.algorithm_name}")
    try:
        claims = jwt.decode(token, key.key, algorithms=[alg], issuer=trust.issuer, leeway=LEEWAY,
                            options={"require": ["exp", "iss", "aud", "sub"],
                                     "verify_aud": False})
    except ExpiredSignatureError:
        raise CallerTokenError("expired", "the token has expired") from None
    except ImmatureSignatureError:
        raise CallerTokenError("not-yet-valid", "the token is not valid yet (nbf/iat)") from None
    except InvalidIssuerError:
        raise CallerTokenError("issuer", f"iss is not the API server's issuer {trust.issuer!r}"
                               ) from None
    except InvalidSignatureError:
        raise CallerTokenError("signature", "the signature does not verify") from None
    except MissingRequiredClaimError as exc:
        raise CallerTokenError("malformed", f"no {exc.claim} claim") from None
    except (InvalidTokenError, PyJWKError, ValueError, TypeError) as exc:
        raise CallerTokenError("malformed", f"{type(exc).__name__}") from None
    return claims, kid


def _bound(claims: Mapping[str, Any]) -> tuple[str, str, str, str, tuple[str, ...]]:
    """(claim, name, uid, attested group, audiences) of a decoded token."""
    private = claims.get("kubernetes.io")
    if not isinstance(private, Mapping):
        raise CallerTokenError("not-webhook-bound", "no kubernetes.io claims")
    refs = [(claim, private.get(claim)) for claim in KINDS.values() if claim in private]
    ref = refs[0][1] if len(refs) == 1 else None
    if not isinstance(ref, Mapping):
        raise CallerTokenError("not-webhook-bound", "the token is not bound to exactly one "
                                                    "webhook configuration")
    claim = refs[0][0]
    name, uid = ref.get("name"), ref.get("uid")
    if not (isinstance(name, str) and isinstance(uid, str)):
        raise CallerTokenError("not-webhook-bound", f"{claim} has no name and uid")
    attestations = private.get("attestations")
    groups = attestations.get("admissionReviewAPIGroups") if isinstance(attestations, Mapping) else None
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], str)
            and groups[0]):
        raise CallerTokenError("api-group", "no single admissionReviewAPIGroups attestation")
    aud = claims.get("aud")
    audiences = (aud,) if isinstance(aud, str) else tuple(a for a in aud if isinstance(a, str)) \
        if isinstance(aud, list) else ()
    return claim, name, uid, groups[0], audiences


def _admit(caller: Caller, path: str, trust: Trust, now: float) -> None:
    """The checks that depend on the request and on our configurations as they are now."""
    if caller.expires + LEEWAY < now:
        raise CallerTokenError("expired", "the token has expired")
    bindings = trust.routes.get(path, ())
    same = [b for b in bindings if b.claim == caller.claim and b.name == caller.name]
    if not same:  # the answer names only what the token holds, never our objects
        raise CallerTokenError("configuration", f"bound to {caller.claim} {caller.name[:64]!r}, "
                                                f"which does not call {path[:64]}")
    binding = same[0]
    if binding.uid != caller.uid:
        raise CallerTokenError("configuration-uid", f"bound to uid {caller.uid[:40]} of "
                                                    f"{caller.name!r}, which has been re-created")
    if not binding.audiences.intersection(caller.audiences):
        raise CallerTokenError("audience", f"aud is not {' or '.join(sorted(binding.audiences))}")


def verify(token: str, path: str, trust: Trust, now: float | None = None) -> Caller:
    """A caller whose token lets it ask on ``path``; raises :class:`CallerTokenError`."""
    claims, _ = _claims(token, trust)
    claim, name, uid, group, audiences = _bound(claims)
    exp = claims.get("exp")
    caller = Caller(str(claims.get("sub", ""))[:256], claim, name, uid, audiences, group,
                    float(exp) if isinstance(exp, int | float) else 0.0)
    _admit(caller, path, trust, time.time() if now is None else now)
    return caller


# --------------------------------------------------------------------------- source


Get = Callable[[str, str], dict[str, Any]]
"""A JSON GET on the API server: (path, Accept media type) -> the decoded body."""


@dataclass
class KeySource:
    """Reads the issuer, the JWKS and our configurations through ``get`` (a JSON GET on
    the API server) into a :class:`Trust`, now and then, on a thread of its own."""

    get: Get
    configurations: list[tuple[str, str]]
    """(resource, name): ``validatingwebhookconfigurations``/``mutatingwebhookconfigurations``."""
    trust: Trust | None = None
    problem: str = "not read yet"
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _last: float = float("-inf")

    def read(self) -> Trust:
        discovery = self.get("/.well-known/openid-configuration", "application/json")
        issuer = discovery.get("issuer")
        if not isinstance(issuer, str) or not issuer:
            raise ValueError("the OIDC discovery document names no issuer")
        jwks = self.get("/openid/v1/jwks", "application/jwk-set+json")
        keys: dict[str, Any] = {}
        for entry in jwks.get("keys") or ():
            try:
                key = jwt.PyJWK(entry)
            except (PyJWKError, InvalidTokenError, ValueError, TypeError, KeyError):
                continue  # a key type we do not use; the others still count
            keys[entry.get("kid") or ""] = key
        if not keys:
            raise ValueError("the API server's JWKS holds no usable key")
        routes: dict[str, list[Binding]] = {}
        missing: list[str] = []
        for resource, name in self.configurations:
            try:
                config = self.get(f"/apis/admissionregistration.k8s.io/v1/{resource}/{name}",
                                  "application/json")
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                missing.append(f"{resource}/{name}")
                continue  # not there (yet): it binds no token; the keys are still read and used
            for path, binding in bindings_of(resource, config).items():
                routes.setdefault(path, []).append(binding)
        return Trust(issuer, keys, {p: tuple(b) for p, b in routes.items()}, time.time(),
                     tuple(missing))

    def refresh(self, *, soon: bool = False) -> Trust | None:
        """Read now. ``soon`` (a request met an unknown key id or configuration uid):
        only if no read finished in the last MIN_REFRESH seconds and none is under way —
        requests never queue behind a read, whoever sends them."""
        if not self._lock.acquire(blocking=not soon):
            return self.trust
        try:
            if soon and time.monotonic() - self._last < MIN_REFRESH:
                return self.trust
            try:
                trust = self.read()
                old = self.trust
                self.trust = trust
                self.problem = ""
                if old is None or (old.issuer, set(old.keys), old.routes) != (
                        trust.issuer, set(trust.keys), trust.routes):
                    log.info("caller tokens: keys and configurations read", extra={"fields": {
                        "issuer": trust.issuer, "keys": len(trust.keys),
                        "paths": sorted(trust.routes), "missing": list(trust.missing)}})
            except Exception as exc:  # keep what we had: a blip must not lock everyone out
                self.problem = f"cannot read the API server's keys or our configurations: " \
                               f"{type(exc).__name__}: {str(exc)[:200]}"
                log.warning("caller tokens: %s", self.problem)
            self._last = time.monotonic()
            return self.trust
        finally:
            self._lock.release()

    def problems(self) -> list[str]:
        """Not ready: nothing read yet, or the last good read is older than STALE (keys
        the API server dropped would still be trusted, new ones not yet)."""
        if self.trust is None:
            return [self.problem]
        age = time.time() - self.trust.loaded
        if age > STALE:
            return [f"keys and configurations last read {age:.0f} s ago (> {STALE:.0f} s): "
                    f"{self.problem}"]
        return []

    def start(self, interval: float = REFRESH) -> None:
        def loop() -> None:
            while True:
                self.refresh()  # soon again while nothing is read or a configuration is missing
                self._wake.wait(interval if self.trust and not self.trust.missing else 5.0)
                self._wake.clear()

        threading.Thread(target=loop, name="caller-token-keys", daemon=True).start()


# ------------------------------------------------------------------------- request


@dataclass
class CallerCheck:
    """The per-request check: ``warn`` counts and logs, ``enforce`` also refuses."""

    mode: Mode
    source: KeySource
    count: Callable[[str], None] = lambda reason: None
    _cache: dict[str, Caller] = field(default_factory=dict)
    _cache_for: Trust | None = None
    _logged: dict[str, float] = field(default_factory=dict)

    def _verify(self, token: str, path: str, trust: Trust) -> Caller:
        if self._cache_for is not trust:  # new keys or configurations: check everything again
            self._cache.clear()
            self._cache_for = trust
        caller = self._cache.get(token)
        if caller is None:
            caller = verify(token, path, trust)
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[token] = caller
        else:
            _admit(caller, path, trust, time.time())
        return caller

    async def check(self, headers: Iterable[tuple[bytes, bytes]], path: str) -> Caller | CallerTokenError:
        """The verified caller, or why not (a refusal is counted and logged here). A
        verified caller is counted by :meth:`settle`, once per request."""
        try:
            token = bearer(headers)
            if token is None:
                raise CallerTokenError("missing", "no Authorization: Bearer token")
            trust = self.source.trust
            if trust is None:  # the reason is in the log and in /readyz, not in the answer
                raise CallerTokenError("no-keys", "the API server's keys have not been read yet")
            try:
                caller = self._verify(token, path, trust)
            except CallerTokenError as exc:
                if exc.reason not in ("unknown-key", "configuration-uid", "configuration"):
                    raise
                # Keys rotate and configurations are re-created: read again (rate-limited).
                fresh = await asyncio.to_thread(self.source.refresh, soon=True)
                if fresh is None or fresh is trust:
                    raise
                caller = self._verify(token, path, fresh)
        except CallerTokenError as exc:
            self.failed(exc, path)
            return exc
        return caller

    def settle(self, caller: Caller, groups: Iterable[str], path: str) -> CallerTokenError | None:
        """The end of a verified caller's request, called once per request: counted
        ``valid`` when the token's attested group covers every API group the review
        names (its kind's and its resource's: both come from the sender, and the rules
        are chosen by the kind; none when the body was not a review to judge), else
        the ``api-group`` refusal, counted and returned."""
        missing = sorted({g for g in groups if not caller.allows(g)})
        if not missing:
            self.count("valid")
            return None
        refused = CallerTokenError("api-group", f"the token attests API group {caller.group!r}, "
                                                f"this review is for {missing[0] or 'core'!r}")
        self.failed(refused, path)
        return refused

    def failed(self, exc: CallerTokenError, path: str) -> None:
        self.count(exc.reason)
        now = time.monotonic()
        if now - self._logged.get(exc.reason, float("-inf")) >= 60.0:  # one line a minute a reason
            self._logged[exc.reason] = now
            log.warning("caller token refused" if self.mode == "enforce" else
                        "caller token would be refused (warn mode)",
                        extra={"fields": {"reason": exc.reason, "detail": exc.detail[:300],
                                          "path": path[:100]}})
