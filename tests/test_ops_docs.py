"""The operations docs (troubleshooting, upgrade, runbooks): every relative link names a
file that exists and every #anchor a heading of it (GitHub's slugs), and the
troubleshooting page covers each error text it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [DOCS / "troubleshooting.md", DOCS / "upgrade.md", *sorted((DOCS / "runbooks").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_matches_github() -> None:
    assert slug("`x509: certificate is valid for …, not …`") == "x509-certificate-is-valid-for--not-"
    assert slug("`remote error: tls: …` (mTLS)") == "remote-error-tls--mtls"
    assert slug("Install with Helm") == "install-with-helm"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}: {target} does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page.name}: {link}: no heading #{anchor} in {target.name}"


def test_troubleshooting_names_the_api_server_texts() -> None:
    """The texts as k8s.io/apiserver / apimachinery v0.34.12 and Go's TLS stack print them."""
    text = (DOCS / "troubleshooting.md").read_text()
    for phrase in ('denied the request', 'failed calling webhook "', 'failed to call webhook: Post "',
                   'no endpoints available for service "envelope"',
                   "tls: failed to verify certificate: x509: certificate signed by unknown authority",
                   "context deadline exceeded", "connect: connection refused", "i/o timeout",
                   "the server rejected our request for an unknown reason",
                   "the server has asked for the client to provide credentials",
                   "received invalid webhook response", "does not support dry run",
                   "request did not complete within requested timeout", "not yet ready to handle request",
                   "failing open", "failing closed", "apiserver_admission_webhook_fail_open_count",
                   "kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration envelope",
                   "webhooks.excludeNamespaces"):
        assert phrase in text, phrase
    for namespace in ("gpu-operator", "monitoring", "argocd", "cert-manager"):
        assert f"| `{namespace}`" in text, namespace
