"""The chart's caller-authentication (mTLS) wiring, rendered by the real ``helm
template`` (helm found as tests/chart/test_chart.py finds it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.chart import render, render_error


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
    # The kubelet has no client certificate: the probes ask the metrics port, which
    # serves /healthz and /readyz too, so readiness still follows the caches.
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        assert r.container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    # without a metrics port, all that is left is a TCP check of the HTTPS port
    bare = render({**values, "metrics": {"enabled": False}})
    assert bare.container["readinessProbe"]["tcpSocket"] == {"port": "https"}


def test_client_auth_needs_exactly_one_ca_source() -> None:
    assert "set exactly one of clientAuth.caSecret" in render_error({"clientAuth": {"enabled": True}})
    both = {"clientAuth": {"enabled": True, "caSecret": "a", "caConfigMap": "b"}}
    assert "set exactly one of clientAuth.caSecret" in render_error(both)
    assert "clientAuth" in render_error({"clientAuth": {"enabled": True, "caSecret": "a",
                                                        "names": ["a,b"]}})


def test_network_policy_by_default_admits_the_webhook_port_from_anywhere() -> None:
    policy = render().one("NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress (to the API server) untouched
    assert spec["podSelector"]["matchLabels"] == render().one("Deployment")["spec"]["selector"]["matchLabels"]
    webhook, metrics = spec["ingress"]
    assert webhook == {"ports": [{"port": "https", "protocol": "TCP"}]}  # no "from": every source
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    ports = {p["name"] for p in render().container["ports"]}
    assert {"https", "metrics"} <= ports  # the named ports the policy admits exist


def test_network_policy_values() -> None:
    assert render({"networkPolicy": {"enabled": False}}).of("NetworkPolicy") == []
    no_metrics = render({"metrics": {"enabled": False}}).one("NetworkPolicy")["spec"]["ingress"]
    assert no_metrics == [{"ports": [{"port": "https", "protocol": "TCP"}]}]
    extra = {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 9090}]}
    custom = render({"networkPolicy": {"metrics": {
        # Helm merges maps with the defaults: null removes the default label.
        "namespaceSelector": {"matchLabels": {"team": "obs", "kubernetes.io/metadata.name": None}},
        "podSelector": {"matchLabels": {"app": "prometheus"}}}, "extraIngress": [extra]}})
    ingress = custom.one("NetworkPolicy")["spec"]["ingress"]
    assert ingress[1]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "obs"}},
                                   "podSelector": {"matchLabels": {"app": "prometheus"}}}]
    assert ingress[2] == extra


def test_memory_and_malloc_tuning() -> None:
    container = render().container
    assert container["resources"]["limits"]["memory"] == "384Mi"
    assert container["resources"]["requests"]["memory"] == "384Mi"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MALLOC_ARENA_MAX"] == "2"
    assert env["MALLOC_MMAP_THRESHOLD_"] == env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    off = {e["name"] for e in render({"mallocTuning": False}).container["env"]}
    assert not {n for n in off if n.startswith("MALLOC_")}


def test_network_policy_can_restrict_the_webhook_port_to_named_sources() -> None:
    """networkPolicy.webhook.from (issue 38): the webhook port admits only the given peers
    (the API servers' CIDR, the kubelets' for the probes); the metrics rule is unchanged."""
    peers = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "192.168.0.0/16"}},
             {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
              "podSelector": {"matchLabels": {"component": "kube-apiserver"}}}]
    ingress = render({"networkPolicy": {"webhook": {"from": peers}}}).one("NetworkPolicy")["spec"]["ingress"]
    assert ingress[0] == {"ports": [{"port": "https", "protocol": "TCP"}], "from": peers}
    assert ingress[1] == render().one("NetworkPolicy")["spec"]["ingress"][1]
