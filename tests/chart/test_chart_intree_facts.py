"""The chart runs the namespace fact keeper with its in-tree policy (inTree.enabled,
inTree.namespaceFacts): `serve --in-tree-facts` with the Lease flags, and the RBAC it
needs and nothing more — patch on namespaces (the reads are the watches the server
already has) and the Lease in the release namespace — rendered only then."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.chart import NAMESPACE, deep_merge, render_on

MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
PROVIDED = {"certificates": {"mode": "provided",
                             "provided": {"secretName": "s", "caBundle": "Y2E="}}}
PATCH_NAMESPACES = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["patch"]}


def _render(values: dict[str, Any], *api_versions: str) -> list[dict[str, Any]]:
    code, docs, err = render_on(values, *api_versions)
    assert code == 0, err
    return docs


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _args(docs: list[dict[str, Any]]) -> Any:
    from app.cli import _parser

    [deployment] = _of(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return _parser().parse_args(container["args"])


def _rules(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for d in _of(docs, kind) for rule in d.get("rules") or []]


@pytest.mark.parametrize("mode", ["self", "provided"])
def test_in_tree_runs_the_keeper_with_the_rbac_it_needs(mode: str) -> None:
    values = deep_merge(PROVIDED if mode == "provided" else {}, {"inTree": {"enabled": True}})
    docs = _render(values, MAP_API)
    args = _args(docs)
    assert args.in_tree_facts and args.in_tree_facts_selector == ""
    assert args.namespace == "$(POD_NAMESPACE)"
    fullname = _of(docs, "Deployment")[0]["metadata"]["name"]
    lease = f"{fullname}-leader"
    assert args.lease_name == lease
    assert args.tls_mode == ("self" if mode == "self" else "files")
    cluster_rules = _rules(docs, "ClusterRole")
    # The one new cluster-wide write: patch on namespaces (no get, no update, no create).
    assert [r for r in cluster_rules if "namespaces" in r["resources"]
            and set(r["verbs"]) - {"get", "list", "watch"}] == [PATCH_NAMESPACES]
    reads = {res for r in cluster_rules if set(r["verbs"]) == {"get", "list", "watch"}
             and r["apiGroups"] == [""] for res in r["resources"]}
    assert {"namespaces", "limitranges", "resourcequotas"} <= reads
    # The Lease, in the release namespace only; the Secret only in self mode.
    [role] = _of(docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    by_resource = {(r["resources"][0], tuple(r.get("resourceNames", ()))): r["verbs"]
                   for r in role["rules"]}
    expected = {("leases", ()): ["create"], ("leases", (lease,)): ["get", "update"],
                ("leases", (f"{lease}-facts",)): ["update"]}
    if mode == "self":
        expected |= {("secrets", ()): ["create"],
                     ("secrets", (f"{fullname}-tls",)): ["get", "update"]}
    assert by_resource == expected
    [binding] = _of(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


@pytest.mark.parametrize("values, apis", [
    ({}, (MAP_API,)),                                               # inTree off (the default)
    ({"inTree": {"enabled": True}}, ()),                            # no MutatingAdmissionPolicy API
    ({"inTree": {"enabled": True, "namespaceFacts": False}}, (MAP_API,)),  # kept some other way
], ids=["off", "no-api", "namespaceFacts-false"])
def test_no_keeper_and_no_namespace_writes_otherwise(values: dict[str, Any],
                                                     apis: tuple[str, ...]) -> None:
    docs = _render(deep_merge(PROVIDED, values), *apis)
    args = _args(docs)
    assert not args.in_tree_facts and args.lease_name == "envelope-leader"  # the flag's default
    assert PATCH_NAMESPACES not in _rules(docs, "ClusterRole")
    assert _of(docs, "Role") == [] and _of(docs, "RoleBinding") == []  # files mode: no Lease


def test_the_keeper_starts_with_the_chart_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered arguments pass serve's start checks (the namespace from the pod)."""
    from app.cli.serve import _serve_problem

    docs = _render(deep_merge(PROVIDED, {"inTree": {"enabled": True}}), MAP_API)
    args = _args(docs)
    args.namespace = "envelope-system"  # what the kubelet expands $(POD_NAMESPACE) to
    args.port = args.metrics_port = 0
    assert _serve_problem(args) is None
