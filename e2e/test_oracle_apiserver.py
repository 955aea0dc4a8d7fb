"""Quantity and defaulting oracles: app/k8s/quantity.py and app/defaulting.default_pod
against what the real kube-apiserver accepts and stores (``dryRun=All`` creates,
in a namespace the Envelope webhook does not see).

- Quantity oracle: each generated string goes into a Pod's
  ``emptyDir.sizeLimit`` (a Quantity that, unlike ResourceLists, is stored
  without rounding to 1m), sent as Go's encoder (kubectl) would write the JSON.
  HTTP 400 (the JSON decoder's ParseQuantity refused it) ⇔ parse_quantity
  raises; 201 ⇔ accepted, and the stored canonical string has exactly the value
  parse_quantity gives; 422 "SizeLimit field must be a valid resource quantity"
  ⇔ accepted and negative (validation, not the parser, refuses negatives).
- Defaulting oracle: Pods with pod-level and container resources; every request
  and limit the API server stores (containers, init containers, pod level) must
  equal ``default_pod`` exactly, and the effective request (``pod_requests``) of
  the stored Pod must equal ``effective_pod_requests`` of what was sent.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import pytest
from conftest import oracle_cases
from oracle import create, isolated_namespace, parallel, status_message

from app.k8s.defaulting import default_pod, effective_pod_requests
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.scheduling import pod_requests
from harness import Cluster

DEFAULT_QUANTITY_CASES = 400
DEFAULT_DEFAULTING_CASES = 200

SIGNS = ["", "", "", "+", "-"]
NUMBERS = ["0", "1", "7", "007", "10", "1.5", ".5", "5.", ".", "", "0.0", "123456789",
           "123456789012345678", "1234567890123456789", "12345678901234567890123",
           "0.000000001", "0.0000000001", "0.00000000015", "999999999999999999", "3.14159265358979",
           "1e", "1.2.3", "١"]
SUFFIXES = ["", "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "e3", "E3", "e-3", "E+2", "e0", "e18", "e19", "e-9", "e-10", "e40", "e-40", "e4294967296",
            "e4294967297", "K", "ki", "mi", "e", "E-", "ee3", "Ki5", "i", "b", "MB", "e+",
            "e99999999999999999999"]
SPACES = ["", "", "", "", " ", "\t", "\n", "\u00a0", "\u3000", "\x1c", "\x85", "\u2028", "\u2009"]


def _quantity_string(rng: random.Random) -> str:
    text = rng.choice(SIGNS) + rng.choice(NUMBERS) + rng.choice(SUFFIXES)
    if rng.random() < 0.1:
        text = rng.choice(SPACES) + text + rng.choice(SPACES)
    if rng.random() < 0.03:
        text = text.replace(rng.choice(text or "x"), rng.choice(["x", " ", "_", ","]), 1)
    return text


def _go_json(obj: Any) -> bytes:
    """JSON as Go's encoding/json writes it: UTF-8 as is, control characters and
    U+2028/U+2029 escaped."""
    text = json.dumps(obj, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text.encode()


def _ours(text: str, minor: int) -> tuple[str, Decimal | None]:
    try:
        value = parse_quantity(text, minor=minor)
    except QuantityError:
        return "refused", None
    return ("negative" if value < 0 else "accepted"), value


def _judge(cluster: Cluster, namespace: str, text: str) -> tuple[str, str, Decimal | None]:
    """What the API server does with ``text`` as a Pod's emptyDir.sizeLimit."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"},
           "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    "volumes": [{"name": "v", "emptyDir": {"sizeLimit": text}}]}}
    status, body = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All",
                               raw=_go_json(pod))
    if status == 201:
        stored = body["spec"]["volumes"][0]["emptyDir"]["sizeLimit"]
        return "accepted", stored, parse_quantity(stored)
    message = status_message(body)
    if status == 422 and "SizeLimit field must be a valid resource quantity" in message:
        return "negative", message, None
    if status == 400:
        return "refused", message, None
    return f"HTTP {status}", message, None


def test_quantity_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest,
                         kube_minor: int) -> None:
    cases = oracle_cases(request, DEFAULT_QUANTITY_CASES)
    rng = random.Random(oracle_seed)
    texts = list(dict.fromkeys(_quantity_string(rng) for _ in range(cases * 3)))[:cases]
    namespace = isolated_namespace(cluster, "oracle-quantity")

    def judge(text: str) -> tuple[str, str, Decimal | None]:
        return _judge(cluster, namespace, text)

    disagreements = []
    counts: dict[str, int] = {}
    for text, (kind, detail, value) in zip(texts, parallel(judge, texts), strict=True):
        counts[kind] = counts.get(kind, 0) + 1
        ours, our_value = _ours(text, kube_minor)
        if ours != kind or (kind == "accepted" and our_value != value):
            disagreements.append(f"{text!r}: API server {kind} {detail!r} (value {value}); "
                                 f"app/k8s/quantity.py {ours} (value {our_value})")
    print(f"quantity oracle: {len(texts)} strings, seed {oracle_seed}, {counts}, "
          f"{len(disagreements)} disagreements")
    assert counts.get("accepted", 0) > len(texts) / 4 and counts.get("refused", 0) > len(texts) / 10
    assert not disagreements, "\n".join(disagreements[:20])


def _long_quantity_strings(rng: random.Random) -> list[str]:
    """Values past ParseQuantity's int64 fast path, up to 300,000 digits: its inf.Dec
    path, the rounding up to 1n, the binary cap, exponents with leading zeros."""
    out = []
    for digits in (19, 20, 40, 400, 5_000, 60_000, 300_000):
        body = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(digits - 1))
        for shape in ("{b}", "{b}Gi", "{b}m", "-{b}", "0.{b}", "{h}.{h}Ki", "{b}e-{d}", "0.{b}n",
                      "{b}e+0000000000000000000000003", "0{b}E", "{b}x"):
            out.append(shape.format(b=body, h=body[: max(1, digits // 2)], d=digits + 3))
    out += ["1e" + "0" * 5_000 + "3", "1e-" + "0" * 5_000 + "12", "1e1" + "0" * 30]
    return out


def test_quantity_oracle_long_strings(cluster: Cluster, oracle_seed: int, kube_minor: int) -> None:
    """The API server takes CRD and sizeLimit quantities of any length: app/k8s/quantity.py
    gives the same verdict and value for long ones (parsed in linear time). From 1.38
    ParseQuantity keeps 29 significant digits (``parse_quantity(minor=38)``)."""
    rng = random.Random(oracle_seed)
    texts = _long_quantity_strings(rng)
    namespace = isolated_namespace(cluster, "oracle-quantity-long")
    disagreements = []
    counts: dict[str, int] = {}
    for text, (kind, detail, value) in zip(texts, parallel(lambda t: _judge(cluster, namespace, t), texts),
                                           strict=True):
        counts[kind] = counts.get(kind, 0) + 1
        ours, our_value = _ours(text, kube_minor)
        if ours != kind or (kind == "accepted" and our_value != value):
            disagreements.append(f"{text[:60]!r}... ({len(text)} chars): API server {kind} "
                                 f"{detail[:200]!r}; app/k8s/quantity.py {ours}")
    print(f"long quantity oracle: {len(texts)} strings, seed {oracle_seed}, {counts}, "
          f"{len(disagreements)} disagreements")
    assert counts.get("accepted", 0) > len(texts) / 3
    assert not disagreements, "\n".join(disagreements[:10])


CPU = ["100m", "250m", "1", "1500m", "2", "333m", "2500u", "1001u", "0.1"]
MEM = ["64Mi", "128Mi", "1Gi", "100M", "1500Mi", "1G", "2Gi"]


def _resources(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for which in ("requests", "limits"):
        rl = {}
        if rng.random() < 0.5:
            rl["cpu"] = rng.choice(CPU)
        if rng.random() < 0.5:
            rl["memory"] = rng.choice(MEM)
        if rng.random() < 0.1:
            rl["hugepages-2Mi"] = "4Mi"
        if rl:
            out[which] = rl
    req, lim = out.get("requests", {}), out.get("limits", {})
    for name in list(req):
        if name in lim and parse_quantity(req[name]) > parse_quantity(lim[name]):
            req[name], lim[name] = lim[name], req[name]
    if "hugepages-2Mi" in req or "hugepages-2Mi" in lim:
        # hugepages: requests equal limits, and need a cpu or memory request.
        req["hugepages-2Mi"] = lim["hugepages-2Mi"] = "4Mi"
        req.setdefault("memory", lim.get("memory", "64Mi"))
        if "memory" in lim and parse_quantity(lim["memory"]) < parse_quantity(req["memory"]):
            lim["memory"] = req["memory"]
        out["requests"], out["limits"] = req, lim
    return out


def _defaulting_pod(rng: random.Random, index: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng)}
                       for i in range(rng.randint(1, 3))],
    }
    if rng.random() < 0.3:
        spec["initContainers"] = [
            {"name": f"i{i}", "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng),
             **({"restartPolicy": "Always"} if rng.random() < 0.5 else {})}
            for i in range(rng.randint(1, 2))]
    pod_level: dict[str, Any] = {}
    for which, p in (("limits", 0.7), ("requests", 0.3)):
        rl = {}
        if rng.random() < p:
            rl["cpu"] = rng.choice(["4", "8", "3500m", "16"])
        if rng.random() < p:
            rl["memory"] = rng.choice(["4Gi", "8Gi", "6000Mi", "16Gi"])
        if rng.random() < 0.1:
            rl["hugepages-2Mi"] = rng.choice(["8Mi", "16Mi"])
        if rl:
            pod_level[which] = rl
    if pod_level:
        spec["resources"] = pod_level
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"d-{index}"}, "spec": spec}


def _quantities(rl: Any) -> dict[str, Decimal]:
    return {k: parse_quantity(v) for k, v in (rl or {}).items()}


def _compare(sent: dict[str, Any], stored: dict[str, Any], minor: int) -> list[str]:
    expected = default_pod(sent, minor=minor)["spec"]
    got = stored["spec"]
    problems = []
    for key in ("containers", "initContainers"):
        for want, have in zip(expected.get(key) or [], got.get(key) or [], strict=True):
            for which in ("requests", "limits"):
                w = _quantities(want.get("resources", {}).get(which))
                h = _quantities(have.get("resources", {}).get(which))
                if w != h:
                    problems.append(f"{key}[{want['name']}].{which}: default_pod {w} != stored {h}")
    for which in ("requests", "limits"):
        w = _quantities((expected.get("resources") or {}).get(which))
        h = _quantities((got.get("resources") or {}).get(which))
        if w != h:
            problems.append(f"spec.resources.{which}: default_pod {w} != stored {h}")
    ours = effective_pod_requests(sent, minor=minor)
    theirs = pod_requests(got)
    if ours != theirs:
        problems.append(f"effective request: ours {ours} != the stored pod's {theirs}")
    return problems


def test_defaulting_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest,
                           kube_minor: int) -> None:
    cases = oracle_cases(request, DEFAULT_DEFAULTING_CASES)
    rng = random.Random(f"defaulting-{oracle_seed}")
    pods = [_defaulting_pod(rng, i) for i in range(cases)]
    namespace = isolated_namespace(cluster, "oracle-defaulting")
    results = parallel(lambda p: create(cluster, namespace, "pods", p, dry_run=True), pods)
    disagreements, refused, with_pod_level = [], [], 0
    for pod, (status, body) in zip(pods, results, strict=True):
        if status != 201:
            refused.append(f"{pod['metadata']['name']}: {status_message(body)}")
            continue
        with_pod_level += "resources" in pod["spec"]
        for problem in _compare(pod, body, kube_minor):
            disagreements.append(f"{pod['metadata']['name']}: {problem}\n  sent: {pod['spec']}")
    for line in refused:
        print(f"refused by the API server: {line}")
    judged = len(pods) - len(refused)
    print(f"defaulting oracle: {judged} pods judged ({with_pod_level} with pod-level resources), "
          f"{len(refused)} refused by validation, seed {oracle_seed}, {len(disagreements)} disagreements")
    assert judged >= cases * 0.6, f"only {judged} of {cases} generated pods were valid"
    assert not disagreements, "\n".join(disagreements[:10])


def test_sub_millicore_requests_are_summed_rounded_since_1_37(cluster: Cluster, kube_minor: int) -> None:
    """Recorded in docs/fidelity.md: 1.34 set the pod-level cpu request to the unrounded
    container sum (1.0006 -> 1001m) and then refused the Pod it defaulted (501m + 501m);
    v1.37 defaults pod-level requests in PrepareForCreate, from the rounded containers
    (1002m), and stores the Pod. default_pod reproduces the stored numbers."""
    namespace = isolated_namespace(cluster, "oracle-defaulting")
    image = "registry.k8s.io/pause:3.10"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sub-milli"},
           "spec": {"containers": [
               {"name": "a", "image": image, "resources": {"requests": {"cpu": "500500u"}}},
               {"name": "b", "image": image, "resources": {"requests": {"cpu": "500100u"}}}],
               "resources": {"limits": {"cpu": "2"}}}}
    status, body = create(cluster, namespace, "pods", pod, dry_run=True)
    if kube_minor < 37:  # v1.35.4: the unrounded sum (1001m) < the rounded containers (1002m)
        assert status == 422, body
        assert "must be greater than or equal to aggregate container requests" in status_message(body)
        ours = default_pod(pod, minor=kube_minor)["spec"]
        assert parse_quantity(ours["resources"]["requests"]["cpu"]) == Decimal("1.001")
        return
    assert status == 201, body
    stored = parse_quantity(body["spec"]["resources"]["requests"]["cpu"])
    ours = default_pod(pod)["spec"]
    assert parse_quantity(ours["resources"]["requests"]["cpu"]) == stored == Decimal("1.002")
    containers = sum(parse_quantity(c["resources"]["requests"]["cpu"]) for c in ours["containers"])
    assert containers == Decimal("1.002")


def test_a_zero_container_limit_is_unset_in_pod_level_limit_defaulting_since_1_38(
        cluster: Cluster, kube_minor: int) -> None:
    """Recorded in docs/fidelity.md (the version matrix) and docs/upstream.md: up to 1.37
    a container's cpu limit of 0 is summed into the pod-level limit PrepareForCreate
    defaults (max(request 500m, 1 + 0) = 1); v1.38.0-beta.0 (kubernetes #141014,
    component-helpers ``omitPartiallySetCPUMemLimits``) treats it as unset and defaults
    no pod-level cpu limit. ``default_pod(minor=)`` follows the served minor."""
    namespace = isolated_namespace(cluster, "oracle-defaulting")
    image = "registry.k8s.io/pause:3.10"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "zero-limit"},
           "spec": {"containers": [
               {"name": "a", "image": image,
                "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
               {"name": "b", "image": image, "resources": {"limits": {"cpu": "0", "memory": "1Gi"}}}],
               "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}}}}
    status, body = create(cluster, namespace, "pods", pod, dry_run=True)
    assert status == 201, body
    stored = _quantities(body["spec"]["resources"].get("limits"))
    ours = _quantities(default_pod(pod, minor=kube_minor)["spec"]["resources"].get("limits"))
    assert ours == stored, f"default_pod(minor={kube_minor}) {ours} != stored {stored}"
    if kube_minor < 37:  # 1.34-1.36 default no pod-level limit at all
        assert stored == {}, stored
        return
    assert stored["memory"] == Decimal(2 * 2**30)
    assert stored.get("cpu") == (Decimal(1) if kube_minor < 38 else None), stored


def test_swap_limits_and_probe_edits_are_the_served_minors_to_decide(cluster: Cluster,
                                                                     kube_minor: int) -> None:
    """Recorded in docs/upstream.md (Kubernetes 1.38): Envelope leaves ``limits.swap`` and
    probes exactly as written (tests/core/test_engine_upstream_fields.py) and the API
    server decides. Up to v1.38.0-beta.0 it refuses both: ``swap`` is no container
    resource (``ValidateContainerResourceName``: "must be a standard resource for
    containers"; no swap gate in ``pkg/features/kube_features.go``), and a Pod UPDATE
    may not change a probe (``ValidatePodUpdate``). A minor that accepts either fails
    here, so the decision is made again with the real server."""
    namespace = isolated_namespace(cluster, "oracle-upstream-fields")
    image = "registry.k8s.io/pause:3.10"
    for where in ("container", "pod"):
        resources = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi", "swap": "1Gi"}}
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
        if where == "container":
            spec["containers"][0]["resources"] = resources
        else:
            spec["resources"] = resources
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"swap-{where}"}, "spec": spec}
        status, body = create(cluster, namespace, "pods", pod, dry_run=True)
        assert status == 422, (kube_minor, where, body)
        assert "swap" in status_message(body), status_message(body)
    probe = {"tcpSocket": {"port": 8080}, "periodSeconds": 10}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {"containers": [{"name": "c", "image": image, "readinessProbe": probe}]}}
    status, body = create(cluster, namespace, "pods", pod)
    assert status == 201, body
    body["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = 30
    status, answer = cluster.api("PUT", f"/api/v1/namespaces/{namespace}/pods/probe", body)
    assert status == 422, (kube_minor, answer)
    assert "pod updates may not change fields" in status_message(answer), status_message(answer)
