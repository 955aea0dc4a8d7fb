"""``self`` certificate mode: the webhook is its own CA.

The CA and the serving certificate live in one Secret, which every replica loads (and
reloads). One replica, the holder of a Lease, writes: it creates the Secret, renews the
serving certificate, injects the CA bundle into our webhook configurations, and rotates
the CA without breaking admission — the new CA is trusted first, the serving certificate
switched later, the old CA kept for a bounded overlap timed on the leader's monotonic
clock. ``envelope.io/rotate: <token>`` on the Secret forces a rotation. The steps, the
overlap and readiness during it: docs/security.md, "CA rotation that revokes".

Why one module of ~409 lines: the Secret, the Lease that decides who writes it and the
rotation's steps are one protocol; every replica reads what the leader writes.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from app.cluster.kube import ApiError, KubeClient
from app.serve.tls import KeyPair, TlsState, issue_serving, make_ca, not_after

__all__ = ["LeaseElector", "SelfManaged", "split_bundle", "trusted_bundle"]

log = logging.getLogger("envelope.certs")

ROTATE = "envelope.io/rotate"
ROTATED = "envelope.io/rotated"
PHASE = "envelope.io/rotation-phase"
TRUSTING_SINCE = "envelope.io/trusting-since"
SWITCHED_AT = "envelope.io/switched-at"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def split_bundle(pem: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    return [part.strip() + b"\n" + marker + b"\n" for part in pem.split(marker) if part.strip()]


def _join(certs: list[bytes]) -> bytes:
    return b"".join(certs)


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def trusted_bundle(bundle: list[bytes], keep: list[bytes], now: dt.datetime,
                   since_switch: dt.timedelta | None, overlap: dt.timedelta) -> list[bytes]:
    """The CAs the webhook configurations trust after this step.

    ``keep`` (the current CA, and the next one while a rotation is trusting it) is
    always in, expired CAs (by ``now``) never. Any other CA (one rotated out) stays only
    while ``since_switch`` — how long ago the serving certificate last switched CA, None
    when no switch is known — is shorter than ``overlap``; after that the bundle trusts
    exactly ``keep``, not every CA of every rotation until it expires."""
    live = [c for c in bundle if not_after(c) > now]
    wanted = {_der(c) for c in keep}
    have = {_der(c) for c in live}
    live += [c for c in keep if _der(c) not in have]
    if since_switch is None or since_switch >= overlap:
        live = [c for c in live if _der(c) in wanted]
    return live


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca`` signed ``cert`` (every CA here has the subject ``envelope-ca``,
    so a subject match would say yes for a rotated-out CA too)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


@dataclass
class LeaseElector:
    """Leader election on a coordination.k8s.io/v1 Lease, as client-go's LeaderElector
    does it (k8s.io/client-go/tools/leaderelection/leaderelection.go, ``tryAcquireOrRenew``).

    Expiry is judged on *our* clock: we note when *we* saw the holder's record change
    (``observed_at``, monotonic) and the lease is free only once ``leaseDurationSeconds``
    have passed on our monotonic clock without a change. The holder's ``renewTime`` is
    written for humans and never compared with the local wall clock, so two replicas
    whose clocks disagree by more than the lease duration still never both lead.
    (Comparing ``renewTime`` with the local clock, as before, let a replica whose clock
    ran ahead take a lease that was being renewed, and one whose clock ran behind wait
    out a dead holder for as long as the skew.)
    """

    client: KubeClient
    namespace: str
    name: str
    identity: str
    duration: int = 15
    clock: Callable[[], dt.datetime] = field(default=_now)
    """Wall clock: only for the timestamps written into the Lease."""
    monotonic: Callable[[], float] = field(default=time.monotonic)
    _observed: tuple[Any, ...] | None = field(default=None, init=False, repr=False)
    _observed_at: float = field(default=0.0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    """One elector may serve two loops (the certificate manager and the namespace fact
    keeper, app/intree/facts.py): their GET-then-PUT rounds must not interleave."""

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def _observe(self, spec: dict[str, Any], now: float) -> None:
        record = tuple(spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds",
                                             "acquireTime", "renewTime", "leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now

    def try_acquire(self) -> bool:
        with self._lock:
            return self._try_acquire()

    def _try_acquire(self) -> bool:
        now = self.monotonic()
        stamp = self.clock().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            lease = self.client.request("GET", f"{self.path}/{self.name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                    "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
            if self._write("POST", self.path, body):
                self._observe(spec, now)
                return True
            return False
        spec = lease.setdefault("spec", {})
        self._observe(spec, now)
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            try:
                duration = float(spec.get("leaseDurationSeconds") or self.duration)
            except (TypeError, ValueError):
                duration = float(self.duration)
            if self._observed_at + duration > now:
                return False  # held, and not yet expired by our own clock
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = stamp
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                     "renewTime": stamp})
        if self._write("PUT", f"{self.path}/{self.name}", lease):
            self._observe(spec, now)
            return True
        return False

    def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.client.request(method, path, body)
        except ApiError as exc:
            if exc.status in (409, 422):  # someone else won the race
                return False
            raise
        return True


@dataclass
class SelfManaged:
    client: KubeClient
    state: TlsState
    namespace: str
    secret: str
    names: list[str]
    webhook_configurations: list[tuple[str, str]]
    """(resource, name): ("mutatingwebhookconfigurations", "envelope"), ..."""
    elector: LeaseElector
    cert_days: int = 365
    ca_days: int = 3650
    renew_before: dt.timedelta = dt.timedelta(days=30)
    interval: float = 5.0
    overlap: dt.timedelta = dt.timedelta(seconds=300)
    """How long a rotated-out CA stays trusted after the serving certificate switched."""
    injected: bool = False
    leader: bool = False
    last_error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _read_at: float | None = field(default=None, init=False, repr=False)
    _switch_seen: tuple[str, float] | None = field(default=None, init=False, repr=False)
    """(``envelope.io/switched-at`` as read, our monotonic time when we first read it)."""
    monotonic: Callable[[], float] = field(default=time.monotonic)

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets"

    # -- the loop ---------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True, name="tls-self").start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while True:
            self.step()
            if self._stop.wait(self.interval):
                return

    def step(self) -> None:
        try:
            self.leader = self.elector.try_acquire()
            secret = self._get_secret()
            self._read_at = self.monotonic()
            if self.leader:
                secret = self._reconcile(secret)
            if secret is not None:
                data = secret.get("data") or {}
                self.state.load(KeyPair(_unb64(data.get("tls.crt")), _unb64(data.get("tls.key"))))
            self.injected = self._bundle_trusts_loaded_cert()
            self.last_error = None
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("certificate loop failed", extra={"fields": {"error": self.last_error}})

    def problems(self) -> list[str]:
        out = self.state.problems()
        if not out and not self.injected:
            out.append("CA bundle not yet injected into the webhook configurations")
        unread = None if self._read_at is None else self.monotonic() - self._read_at
        if unread is not None and unread > self.overlap.total_seconds() / 2:
            # A rotation may have switched the serving certificate since; the old CA
            # leaves the bundle ``overlap`` after that switch. Out of the Service
            # before then rather than serve a certificate nobody trusts any more.
            out.append(f"certificate Secret {self.namespace}/{self.secret} not read for "
                       f"{unread:.0f} s (more than half the CA overlap of "
                       f"{self.overlap.total_seconds():.0f} s)")
        if self.last_error and out:
            out.append(self.last_error)
        return out

    # -- reading ------------------------------------------------------------------

    def _get_secret(self) -> dict[str, Any] | None:
        try:
            return self.client.request("GET", f"{self.secret_path}/{self.secret}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _configurations(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for resource, name in self.webhook_configurations:
            path = f"/apis/admissionregistration.k8s.io/v1/{resource}/{name}"
            out.append((path, self.client.request("GET", path)))
        return out

    def _bundle_trusts_loaded_cert(self) -> bool:
        if self.state.cert_pem is None:
            return False
        cert = x509.load_pem_x509_certificate(self.state.cert_pem)
        for _, config in self._configurations():
            for hook in config.get("webhooks") or []:
                bundle = _unb64((hook.get("clientConfig") or {}).get("caBundle"))
                cas = [x509.load_pem_x509_certificate(c) for c in split_bundle(bundle)]
                if not any(_issued_by(cert, ca) for ca in cas):
                    return False
        return True

    # -- writing (leader only) ------------------------------------------------------

    def _new_secret(self) -> dict[str, Any]:
        ca = make_ca(days=self.ca_days)
        serving = issue_serving(ca, self.names, self.cert_days)
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": self.secret, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "envelope"}},
                "data": {"ca.crt": _b64(ca.cert_pem), "ca.key": _b64(ca.key_pem),
                         "ca-bundle.crt": _b64(ca.cert_pem),
                         "tls.crt": _b64(serving.cert_pem), "tls.key": _b64(serving.key_pem)}}
        log.info("created CA and serving certificate", extra={"fields": {"secret": self.secret}})
        return self.client.request("POST", self.secret_path, body)

    def _reconcile(self, secret: dict[str, Any] | None) -> dict[str, Any]:
        """One pass over the Secret: the CA rotation's next step (trust a new CA, switch
        the serving certificate to it) or a serving certificate renewal, then the trust
        bundle trimmed after its overlap; written back when it changed, and injected.

        Why one function of ~81 lines: the rotation's steps and the overlap read and write
        the same data and annotations of one Secret, in one pass, in the order they apply.
        """
        if secret is None:
            secret = self._new_secret()
        data = dict(secret.get("data") or {})
        meta = secret.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        now = _now()
        ca = KeyPair(_unb64(data.get("ca.crt")), _unb64(data.get("ca.key")))
        bundle = [c for c in split_bundle(_unb64(data.get("ca-bundle.crt")) or ca.cert_pem)
                  if not_after(c) > now]
        changed = False
        token = annotations.get(ROTATE)
        phase = annotations.get(PHASE)
        if phase is None and (not_after(ca.cert_pem) - now < self.renew_before
                              or (token and token != annotations.get(ROTATED))):
            # Step 1: trust a new CA next to the old one.
            nxt = make_ca(days=self.ca_days)
            data["ca-next.crt"], data["ca-next.key"] = _b64(nxt.cert_pem), _b64(nxt.key_pem)
            bundle.append(nxt.cert_pem)
            annotations[PHASE] = "trusting"
            annotations[TRUSTING_SINCE] = now.isoformat()
            changed = True
            log.info("CA rotation: new CA added to the trust bundle")
        elif phase == "trusting" and self.injected and now - dt.datetime.fromisoformat(
                annotations.get(TRUSTING_SINCE, now.isoformat())) > dt.timedelta(
                seconds=3 * self.interval):
            # Step 2: the API server trusts both; serve a certificate from the new CA.
            ca = KeyPair(_unb64(data.pop("ca-next.crt")), _unb64(data.pop("ca-next.key")))
            serving = issue_serving(ca, self.names, self.cert_days)
            data.update({"ca.crt": _b64(ca.cert_pem), "ca.key": _b64(ca.key_pem),
                         "tls.crt": _b64(serving.cert_pem), "tls.key": _b64(serving.key_pem)})
            for key in (PHASE, TRUSTING_SINCE):
                annotations.pop(key, None)
            annotations[SWITCHED_AT] = now.isoformat()
            if token:
                annotations[ROTATED] = token
            changed = True
            log.info("CA rotation: serving certificate switched to the new CA")
        elif self._serving_needs_renewal(_unb64(data.get("tls.crt")), now):
            serving = issue_serving(ca, self.names, self.cert_days)
            data["tls.crt"], data["tls.key"] = _b64(serving.cert_pem), _b64(serving.key_pem)
            changed = True
            log.info("serving certificate renewed")
        keep = [ca.cert_pem, *([_unb64(data["ca-next.crt"])] if data.get("ca-next.crt") else [])]
        mark = annotations.get(SWITCHED_AT)
        if mark is None and len(trusted_bundle(bundle, keep, now, None, self.overlap)) \
                < len(bundle):
            # A rotated-out CA and no switch recorded: a Secret written before the
            # overlap was bounded. Start the overlap now rather than drop it at once.
            mark = annotations[SWITCHED_AT] = now.isoformat()
            changed = True
        # The overlap runs on *our* monotonic clock from when we first saw this switch
        # (as the Lease does): a new leader whose wall clock is ahead of the one that
        # switched cannot drop the old CA early; it waits a full overlap from failover.
        since_switch = None
        if mark is not None:
            if self._switch_seen is None or self._switch_seen[0] != mark:
                self._switch_seen = (mark, self.monotonic())
            since_switch = dt.timedelta(seconds=self.monotonic() - self._switch_seen[1])
        before = {_der(c) for c in bundle}
        bundle = trusted_bundle(bundle, keep, now, since_switch, self.overlap)
        removed = len(before - {_der(c) for c in bundle})
        if removed:
            log.info("CA rotation: rotated-out CA removed from the trust bundle",
                     extra={"fields": {"removed": removed, "trusted": len(bundle)}})
        if _b64(_join(bundle)) != data.get("ca-bundle.crt"):
            data["ca-bundle.crt"] = _b64(_join(bundle))
            changed = True
        if changed:
            meta["annotations"] = annotations
            secret["data"] = data
            secret = self.client.request("PUT", f"{self.secret_path}/{self.secret}", secret)
        self._inject(_join(bundle))
        return secret

    def _serving_needs_renewal(self, cert_pem: bytes, now: dt.datetime) -> bool:
        if not cert_pem:
            return True
        cert = x509.load_pem_x509_certificate(cert_pem)
        if cert.not_valid_after_utc - now < self.renew_before:
            return True
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return True
        have = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
        have |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
        return not set(self.names) <= have

    def _inject(self, bundle: bytes) -> None:
        wanted = _b64(bundle)
        for path, config in self._configurations():
            hooks = config.get("webhooks") or []
            if all((h.get("clientConfig") or {}).get("caBundle") == wanted for h in hooks):
                continue
            for hook in hooks:
                hook.setdefault("clientConfig", {})["caBundle"] = wanted
            self.client.request("PUT", path, config)
            log.info("CA bundle injected", extra={"fields": {"configuration": path}})

