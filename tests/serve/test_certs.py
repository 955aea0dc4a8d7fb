"""``--tls-mode self`` CA rotation: what the caBundle trusts at each step (the pure
bundle logic; e2e/test_certificates.py runs the rotation on the real API server)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from app.serve.certs import SelfManaged, _issued_by, trusted_bundle
from app.serve.tls import KeyPair, TlsState, issue_serving, make_ca

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
OVERLAP = dt.timedelta(seconds=300)


def ders(bundle: list[bytes]) -> list[str]:
    return [x509.load_pem_x509_certificate(c).fingerprint(hashes.SHA256()).hex()
            for c in bundle]


def test_no_rotation_trusts_the_current_ca_only() -> None:
    ca = make_ca().cert_pem
    assert trusted_bundle([ca], [ca], NOW, None, OVERLAP) == [ca]
    assert ders(trusted_bundle([], [ca], NOW, None, OVERLAP)) == ders([ca])


def test_while_trusting_the_next_ca_both_stay() -> None:
    old, nxt = make_ca().cert_pem, make_ca().cert_pem
    assert trusted_bundle([old, nxt], [old, nxt], NOW, None, OVERLAP) == [old, nxt]


def test_rotated_out_ca_stays_for_the_overlap_then_goes() -> None:
    old, new = make_ca().cert_pem, make_ca().cert_pem
    assert trusted_bundle([old, new], [new], NOW, dt.timedelta(seconds=299),
                          OVERLAP) == [old, new]
    assert trusted_bundle([old, new], [new], NOW, dt.timedelta(seconds=300), OVERLAP) == [new]


def test_two_rotations_end_with_one_ca_not_three() -> None:
    """Before: every rotated-out CA stayed until it expired (ten years), so after two
    forced rotations the bundle trusted three CAs."""
    first, second, third = (make_ca().cert_pem for _ in range(3))
    bundle = [first, second, third]
    assert trusted_bundle(bundle, [third], NOW, dt.timedelta(seconds=10), OVERLAP) == bundle
    assert trusted_bundle(bundle, [third], NOW, OVERLAP, OVERLAP) == [third]


def test_a_rotation_started_during_the_overlap_keeps_its_next_ca() -> None:
    old, current, nxt = (make_ca().cert_pem for _ in range(3))
    assert trusted_bundle([old, current, nxt], [current, nxt], NOW, dt.timedelta(hours=1),
                          OVERLAP) == [current, nxt]


def test_expired_cas_are_dropped_even_within_the_overlap() -> None:
    expired = make_ca(days=0).cert_pem  # not_after = now: expired by NOW + 1 s
    current = make_ca().cert_pem
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert trusted_bundle([expired, current], [current], later, dt.timedelta(0),
                          OVERLAP) == [current]


def test_issued_by_tells_cas_with_the_same_subject_apart() -> None:
    """Every CA is ``CN=envelope-ca``: a subject match (as before) said a serving
    certificate from a rotated-out CA was still trusted by a bundle of the new CA."""
    old, new = make_ca(), make_ca()
    serving = x509.load_pem_x509_certificate(issue_serving(old, ["envelope.svc"]).cert_pem)
    assert _issued_by(serving, x509.load_pem_x509_certificate(old.cert_pem))
    assert not _issued_by(serving, x509.load_pem_x509_certificate(new.cert_pem))


def test_a_replica_that_cannot_read_the_secret_leaves_readiness_before_the_old_ca_goes() -> None:
    clock = [1000.0]
    ca = make_ca()
    state = TlsState()
    serving = issue_serving(ca, ["envelope.svc"])
    assert state.load(KeyPair(serving.cert_pem, serving.key_pem))
    manager = SelfManaged(client=None, state=state, namespace="ns", secret="envelope-tls",  # type: ignore[arg-type]
                          names=["envelope.svc"], webhook_configurations=[], elector=None,  # type: ignore[arg-type]
                          overlap=OVERLAP, injected=True, monotonic=lambda: clock[0])
    manager._read_at = clock[0]
    assert manager.problems() == []
    clock[0] += 150
    assert manager.problems() == []
    clock[0] += 1
    [problem] = manager.problems()
    assert problem == ("certificate Secret ns/envelope-tls not read for 151 s (more than "
                       "half the CA overlap of 300 s)")
