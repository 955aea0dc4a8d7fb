"""The chart's caller-authentication (mTLS) wiring, rendered by the real ``helm
template`` (helm found as tests/test_chart.py finds it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_chart import render, render_error


def _sources(values: dict[str, Any]) -> list[dict[str, Any]]:
    volumes = render(values).pod_spec["volumes"]
    return next(v for v in volumes if v["name"] == "config")["projected"]["sources"]


def test_client_auth_is_off_by_default() -> None:
    r = render()
    assert r.arg("--client-ca-file") is None and r.arg("--client-names") is None
    assert r.container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert not any("client-ca" in str(s) for s in _sources({}))


@pytest.mark.parametrize("source", ["caSecret", "caConfigMap"])
def test_client_auth_mounts_the_ca_and_sets_the_flags(source: str) -> None:
    values = {"clientAuth": {"enabled": True, source: "apiserver-client-ca", "caKey": "bundle.pem",
                             "names": ["kube-apiserver", "apiserver-b"]}}
    r = render(values)
    assert r.arg("--client-ca-file") == "/etc/envelope/client-ca/ca.crt"
    assert r.arg("--client-names") == "kube-apiserver,apiserver-b"
    kind = "secret" if source == "caSecret" else "configMap"
    mounted = [s[kind] for s in _sources(values) if kind in s and s[kind]["name"] == "apiserver-client-ca"]
    assert mounted == [{"name": "apiserver-client-ca",
                        "items": [{"key": "bundle.pem", "path": "client-ca/ca.crt"}]}]
    mount = next(m for m in r.container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/envelope" and mount["readOnly"] is True
    # The kubelet has no client certificate: the probes cannot be HTTPS requests.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert r.container[probe]["tcpSocket"] == {"port": "https"}, probe
        assert "httpGet" not in r.container[probe]


def test_client_auth_needs_exactly_one_ca_source() -> None:
    assert "set exactly one of clientAuth.caSecret" in render_error({"clientAuth": {"enabled": True}})
    both = {"clientAuth": {"enabled": True, "caSecret": "a", "caConfigMap": "b"}}
    assert "set exactly one of clientAuth.caSecret" in render_error(both)
    assert "clientAuth" in render_error({"clientAuth": {"enabled": True, "caSecret": "a",
                                                        "names": ["a,b"]}})
