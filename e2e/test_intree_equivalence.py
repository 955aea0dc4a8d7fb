"""Equivalence oracle for the in-tree MutatingAdmissionPolicy (app/intree/, issue 22):
every generated write is answered the same by the webhook alone and by the policy plus
the reduced webhook.

On the 1.37 API server, per policy (the default one, and a variant with other names,
the guards off, ``memory-limit`` in warn mode, ``annotatePods`` and exceptions by object
and namespace labels), one Envelope webhook process serves two sets of namespaces:

- ``webhook``: the mutating webhook with today's matchConditions
  (``app.chart.matchconditions``), no policy;
- ``intree``: the generated MutatingAdmissionPolicy + binding and the mutating webhook
  with the reduced condition (``Compiled.webhook_condition``).

Both sets share one validating webhook. Each set has a plain namespace (holding the
namespace fact label, as app/intree/facts.py writes it), one with a ResourceQuota on
``limits.cpu`` (no fact: the guards report there) and, for the variant, one an exception
exempts by its labels and one whose LimitRange gives Pods default CPU and memory limits
(the guards are off there, so the policy runs after LimitRanger). Every generated object
(every workload kind; the resource shapes of the admission oracles: limits only,
requests only, both, sidecars, pod-level resources; string envelopes; opt-out and
exemption annotations; object labels an exception selects) is created with
``dryRun=All`` in both sets, then stored for real and UPDATEd (dry run) with another pod
spec (every kind but Pod). The answers must match: the HTTP status, the object the API
server would store (bar names, uid, timestamps), the refusal message and the warnings
(the webhook's ``envelope[rule]: ...`` texts; nothing in the in-tree path words a
warning differently, because the policy is only generated where the webhook would not
warn).

A second test removes one clause from the generated policy (the opt-out) and shows the
oracle then finds differences: the check is not vacuous.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3
import yaml

import harness
from app.chart.matchconditions import mutate_match_conditions
from app.core.config import Policy
from app.core.ruleset import default_ruleset
from app.intree import FACT_LABEL, FACT_VALUE, compile_in_tree
from app.intree.validating import COMPILABLE, compile_validating, pod_level_clause, webhook_partition
from harness import Cluster

pytestmark = pytest.mark.e2e

RULES = default_ruleset()
PER_POLICY = 170
SET_LABEL = "intree.envelope.test/set"
POLICY_LABEL = "intree.envelope.test/policy"

POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "variant": {
        "optOutAnnotation": "example.com/keep-cpu",
        "annotatePods": True,
        "envelopeEnv": {"limits": "APP_LIMITS", "requests": "APP_REQUESTS"},
        "rules": {"quota-needs-cpu-limits": "off", "limitrange-needs-cpu-limits": "off",
                  "memory-limit": "warn"},
        "exceptions": [
            {"rules": ["cpu-limits"], "objectSelector": {"matchLabels": {"team": "legacy"}}},
            {"rules": ["*"], "namespaceSelector": {"matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["exempt"]}]}},
        ],
    },
    # memory-request-equals-limit warns: a ValidatingAdmissionPolicy with Warn, and the
    # validating webhook partitioned so that it does not warn again in the policy's domain
    "memwarn": {
        "rules": {"memory-request-equals-limit": "warn"},
        "exceptions": [
            {"rules": ["memory-request-equals-limit"], "objectSelector": {
                "matchLabels": {"team": "legacy"}}},
            {"rules": ["memory-request-equals-limit"], "namespaceSelector": {
                "matchLabels": {"tier": "exempt"}}},
        ],
    },
}
PLURAL = {"Pod": "pods", "ReplicationController": "replicationcontrollers",
          "Deployment": "deployments", "ReplicaSet": "replicasets", "StatefulSet": "statefulsets",
          "DaemonSet": "daemonsets", "Job": "jobs", "CronJob": "cronjobs"}

# ------------------------------------------------------------------- the generator

CPU = ["100m", "250m", "500m", "0.5", "1", "1500m", "2", "4", "7"]
MEMORY = ["64Mi", "256Mi", "1Gi", "1024Mi", "2G"]
LONG = "-with-a-name-long-enough-to-cut-the-warning"


def _resources(rng: random.Random) -> dict[str, Any] | None:
    """The shapes of e2e/test_oracle_admission.py's and test_matchconditions.py's
    generators: CPU limit only, with a request below it, requests only, memory request
    = limit or not, other resources beside."""
    cpu, mem = rng.choice(CPU), rng.choice(MEMORY)
    return rng.choice([
        None,
        {},
        {"limits": {"cpu": cpu}},
        {"limits": {"cpu": cpu, "memory": mem}},
        {"limits": {"cpu": cpu, "memory": mem}, "requests": {"cpu": "100m", "memory": mem}},
        {"limits": {"cpu": cpu}, "requests": {"cpu": "100m"}},
        {"limits": {"memory": mem}, "requests": {"memory": mem}},
        {"requests": {"memory": mem}},
        {"requests": {"cpu": cpu, "memory": mem}},
        {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
        {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        {"requests": {"memory": "1Gi"}, "limits": {"memory": "1024Mi"}},  # equal, spelt apart
        {"requests": {"memory": "1G"}, "limits": {"memory": rng.choice(["1Gi", "1000Mi"]),
                                                  "cpu": cpu}},
        {"requests": {"cpu": "100m"}, "limits": {"memory": mem, "ephemeral-storage": "1Gi"}},
        {"limits": {"ephemeral-storage": "1Gi", "cpu": cpu}, "requests": {"memory": mem}},
    ])


def _env(rng: random.Random, names: tuple[str, ...]) -> list[dict[str, Any]] | None:
    choice = rng.randrange(9)
    if choice < 4:
        return None
    name = rng.choice(names)
    value = rng.choice(["memory=1Gi", "", "garbage", "cpu=2,memory=1Gi", "CPU=1, memory=512Mi",
                        "cpuset=0-3", "cpu=2", "memory=1Gi,cpu=500m", "$(BASE),memory=1Gi"])
    env: list[dict[str, Any]] = [{"name": "BASE", "value": "cpu=1"}]
    if choice == 8:
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    else:
        env.append({"name": name, "value": value} if value else {"name": name})
    return env


def _container(rng: random.Random, name: str, env_names: tuple[str, ...]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    resources = _resources(rng)
    if resources is not None:
        c["resources"] = resources
    env = _env(rng, env_names)
    if env is not None:
        c["env"] = env
    return c


def _pod_spec(rng: random.Random, env_names: tuple[str, ...]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        _container(rng, f"c{i}" + (LONG if rng.random() < 0.15 else ""), env_names)
        for i in range(rng.randint(1, 3))]}
    if rng.random() < 0.3:
        spec["initContainers"] = [_container(rng, f"init{i}", env_names)
                                  for i in range(rng.randint(1, 2))]
        if rng.random() < 0.5:
            spec["initContainers"][0]["restartPolicy"] = "Always"  # a sidecar
    if rng.random() < 0.2:
        spec["resources"] = rng.choice([
            {"limits": {"cpu": "8", "memory": "16Gi"}},
            {"limits": {"cpu": "8"}},
            {"limits": {"cpu": "8"}, "requests": {"cpu": "2"}},
            {"requests": {"memory": "8Gi"}},
            {"limits": {"memory": "16Gi"}, "requests": {"memory": "16Gi"}},
        ])
    return spec


def _annotations(rng: random.Random, keys: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    if rng.random() < 0.35:
        out[rng.choice(keys)] = rng.choice(["true", " TRUE ", "false", "True", "yes", "true\t"])
    if rng.random() < 0.1:
        out["envelope.io/exempt"] = rng.choice(["cpu-limits", "memory-limit", "quantities",
                                                "memory-request-equals-limit"])
    return out


def generate(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    """Workloads of every kind Envelope judges (app/k8s/podspec.py POD_SPEC_PATHS)."""
    keys = ("envelope.io/keep-cpu-limit", "example.com/keep-cpu")
    env_names = ("RESOURCE_LIMITS", "APP_LIMITS", "RESOURCE_REQUESTS")
    for i in range(count):
        kind = list(PLURAL)[i % len(PLURAL)]
        spec = _pod_spec(rng, env_names)
        labels = {"app": "intree", **({"team": "legacy"} if rng.random() < 0.1 else {})}
        meta: dict[str, Any] = {"name": f"w{i}-{kind.lower()}", "labels": labels}
        if annotations := _annotations(rng, keys):
            meta["annotations"] = annotations
        template: dict[str, Any] = {"metadata": {"labels": {"app": "intree"}}, "spec": spec}
        if template_annotations := _annotations(rng, keys):
            template["metadata"]["annotations"] = template_annotations
        if kind == "Pod":
            yield {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        elif kind in ("Job", "CronJob"):
            spec["restartPolicy"] = "Never"
            del template["metadata"]["labels"]
            job = {"template": template}
            yield ({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job}
                   if kind == "Job" else
                   {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
                    "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": job}}})
        elif kind == "ReplicationController":
            yield {"apiVersion": "v1", "kind": kind, "metadata": meta,
                   "spec": {"selector": {"app": "intree"}, "template": template}}
        else:
            body: dict[str, Any] = {"selector": {"matchLabels": {"app": "intree"}},
                                    "template": template}
            if kind == "StatefulSet":
                body["serviceName"] = "intree"
            yield {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}


# ------------------------------------------------------------------- the two paths


def _hook(name: str, url: str, bundle: str, selector: dict[str, str],
          condition: str | None) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Fail", "timeoutSeconds": 10,
        "clientConfig": {"url": url, "caBundle": bundle},
        "namespaceSelector": {"matchLabels": selector},
        "rules": [{"apiGroups": ["", "apps", "batch"], "apiVersions": ["v1"],
                   "operations": ["CREATE", "UPDATE"], "scope": "Namespaced",
                   "resources": list(PLURAL.values())}]}
    if condition is not None:
        hook["reinvocationPolicy"] = "IfNeeded"
        hook["matchConditions"] = [{"name": "envelope-may-mutate", "expression": condition}]
    return hook


def configurations(name: str, policy: Policy, webhook: harness.Webhook,
                   mutilate: tuple[str, str] | None = None,
                   mutilate_validating: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """The webhook configurations of both sets and the in-tree policies of the ``intree``
    set, for one policy (``name`` labels its namespaces and names its objects: a run's
    own, so a configuration the API server has not yet dropped cannot answer for it).
    ``mutilate``: (text, replacement) applied to the MutatingAdmissionPolicy;
    ``mutilate_validating``: to the ValidatingAdmissionPolicies' domains, everywhere they
    are used (the policies and the validating webhook's partition)."""
    bundle = base64.b64encode(webhook.ca_file.read_bytes()).decode()
    full = mutate_match_conditions(RULES, policy)[0]["expression"]
    lease = f"intree-e2e-{name}-facts"
    compiled = compile_in_tree(RULES, policy, fact_lease=("default", lease))
    assert compiled.rules, "nothing compiled: the oracle would compare the webhook with itself"
    only = {POLICY_LABEL: name}
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration", "metadata": {"name": f"intree-e2e-{name}"},
                "webhooks": [
                    _hook("full.mutate.envelope.test", webhook.url + "/mutate", bundle,
                          {**only, SET_LABEL: "webhook"}, full),
                    _hook("reduced.mutate.envelope.test", webhook.url + "/mutate", bundle,
                          {**only, SET_LABEL: "intree"}, compiled.webhook_condition)]}
    vap = compile_validating(RULES, policy)
    if mutilate_validating is not None:
        old, new = mutilate_validating
        assert all(old in d for d in vap.domains.values()), f"{old!r} is in no domain"
        vap = dataclasses.replace(vap, domains={r: d.replace(old, new) for r, d in vap.domains.items()},
                                  manifests=json.loads(json.dumps(vap.manifests).replace(
                                      json.dumps(old)[1:-1], json.dumps(new)[1:-1])))
    validating = {"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "ValidatingWebhookConfiguration", "metadata": {"name": f"intree-e2e-{name}"},
                  "webhooks": [
                      _hook("validate.envelope.test", webhook.url + "/validate", bundle,
                            {**only, SET_LABEL: "webhook"}, None),
                      *webhook_partition(_hook("intree.validate.envelope.test",
                                               webhook.url + "/validate", bundle,
                                               {**only, SET_LABEL: "intree"}, None), vap)]}
    manifests = json.loads(json.dumps(compiled.manifests))
    selector = {"matchLabels": {**only, SET_LABEL: "intree"}}
    for manifest in manifests:
        manifest["metadata"]["name"] = f"intree-e2e-{name}"
        if manifest["kind"] == "MutatingAdmissionPolicy":
            manifest["spec"]["matchConstraints"]["namespaceSelector"] = selector
        else:
            manifest["spec"]["policyName"] = f"intree-e2e-{name}"
            manifest["spec"]["matchResources"]["namespaceSelector"] = {
                **selector, "matchExpressions": compiled.namespace_requirements}
    if mutilate is not None:
        text = json.dumps(manifests)
        assert mutilate[0] in text, f"the clause {mutilate[0]!r} is not in the generated policy"
        manifests = json.loads(text.replace(mutilate[0], mutilate[1]))
    validating_policies = json.loads(json.dumps(vap.manifests))
    for manifest in validating_policies:
        own = f"intree-e2e-{name}-{manifest['metadata']['name'].split('.')[0]}"
        manifest["metadata"]["name"] = own
        if manifest["kind"] == "ValidatingAdmissionPolicy":
            manifest["spec"]["matchConstraints"]["namespaceSelector"] = selector
        else:
            manifest["spec"]["policyName"] = own
            manifest["spec"]["matchResources"]["namespaceSelector"] = {
                **selector, "matchExpressions": vap.namespace_requirements}
    # The keeper's Lease the binding reads (app/intree/facts.py FactLease), renewed for the
    # run: the namespaces carry the fact as a keeper would have written it.
    leases = [{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": lease, "namespace": "default"},
               "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 86400,
                        "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}}
              ] if "paramKind" in json.dumps(manifests) else []
    return [mutating, validating, *manifests, *validating_policies, *leases]


def _namespaces(cluster: Cluster, name: str, policy: Policy) -> dict[str, dict[str, str]]:
    """Per namespace role, the namespace of each set."""
    roles: dict[str, dict[str, str]] = {}
    guards = any(policy.rules.get(g, "warn") != "off"
                 for g in ("quota-needs-cpu-limits", "limitrange-needs-cpu-limits"))
    extra = (["exempt"] if policy.exceptions else []) + ([] if guards else ["limitrange"])
    for role in ("plain", "quota", *extra):
        roles[role] = {}
        for which in ("webhook", "intree"):
            ns = harness.unique_name(f"e2e-it-{name[:3]}-{role}-{which[:2]}", max_length=50)
            labels = {harness.ISOLATED_NAMESPACE_LABEL: "true", POLICY_LABEL: name, SET_LABEL: which}
            if role in ("plain", "exempt"):  # no LimitRange, no ResourceQuota there
                labels[FACT_LABEL] = FACT_VALUE  # as app/intree/facts.py would write it
            if role == "exempt":
                labels["tier"] = "exempt"
            cluster.create_namespace(ns, labels=labels)
            if role == "quota":
                cluster.api("POST", f"/api/v1/namespaces/{ns}/resourcequotas", {
                    "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"},
                    "spec": {"hard": {"limits.cpu": "1000", "requests.cpu": "1000"}}})
                # status as the quota controller writes it (none may be running)
                cluster.api("PATCH", f"/api/v1/namespaces/{ns}/resourcequotas/cpu/status", {
                    "status": {"hard": {"limits.cpu": "1000", "requests.cpu": "1000"},
                               "used": {"limits.cpu": "0", "requests.cpu": "0"}}},
                    content_type="application/merge-patch+json")
            if role == "limitrange":
                # LimitRanger puts a default CPU limit on Pods before either path runs (and
                # again after it, on reinvocation): both must strip it alike.
                cluster.api("POST", f"/api/v1/namespaces/{ns}/limitranges", {
                    "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
                    "spec": {"limits": [{"type": "Container", "default": {"cpu": "3", "memory": "512Mi"},
                                         "defaultRequest": {"cpu": "1", "memory": "512Mi"}}]}})
            roles[role][which] = ns
    return roles


def _path(obj: dict[str, Any], namespace: str, *, update: bool = False, dry_run: bool = True) -> str:
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    name = f"/{obj['metadata']['name']}" if update else ""
    return f"{base}/namespaces/{namespace}/{PLURAL[obj['kind']]}{name}" + ("?dryRun=All" if dry_run else "")


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A uid in a validation message (a Job's generated selector): each set's own."""
REFUSED_BY = re.compile(r"""^.*?(admission webhook "[^"]*" denied the request: |"""
                        r"""ValidatingAdmissionPolicy '[^']*' with binding '[^']*' denied request: )""")
"""The two documented prefixes of a refusal: the webhook's and a ValidatingAdmissionPolicy's
(each after the API server's ``<resource> "<name>" is forbidden: ``, where it adds one)."""
WARNED_BY = re.compile(r"^Validation failed for ValidatingAdmissionPolicy '[^']*' with binding '[^']*': ")
"""The API server's prefix of a Warn policy's warning (validating/dispatcher.go)."""
FINDING = re.compile(r"(.*?) \[([a-z0-9-]+)\](?:; |$)")
"""One finding of a refusal: ``<message> [<rule>]`` (app/serve/admission.py ``decide``)."""
_VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace",
             "generation", "selfLink")


def _answer(pool: urllib3.PoolManager, cluster: Cluster, obj: dict[str, Any],
            namespace: str, *, update: bool = False, dry_run: bool = True) -> dict[str, Any]:
    """The API server's answer to a CREATE (or, ``update``, a PUT) of ``obj``."""
    response = pool.request("PUT" if update else "POST",
                            cluster.api_url + _path(obj, namespace, update=update, dry_run=dry_run),
                            body=json.dumps(obj).encode(),
                            headers={"Content-Type": "application/json"}, timeout=30)
    body = json.loads(response.data) if response.data else None
    stored = None
    message = ""
    warnings = harness.warning_texts(response.headers)
    # Counted, not compared: how often a ValidatingAdmissionPolicy answered.
    by_policy = ("refused" if response.status == 403 and isinstance(body, dict) and
                 "ValidatingAdmissionPolicy" in str(body.get("message", "")) else
                 "warned" if any(WARNED_BY.match(w) for w in warnings) else "")
    if response.status in (200, 201) and isinstance(body, dict):
        uid = (body.get("metadata") or {}).get("uid")
        if uid:  # a Job's selector and template labels carry its own uid
            body = json.loads(json.dumps(body).replace(uid, "<uid>"))
        meta = body.get("metadata") or {}
        stored = {**body, "metadata": {k: v for k, v in meta.items() if k not in _VOLATILE}}
        stored.pop("status", None)
    elif isinstance(body, dict):
        message = UUID.sub("<uid>", str(body.get("message", "")).replace(namespace, "<ns>"))
        # The one wording difference found: a validation error that dumps the Go object
        # shows a limits map the patch emptied as {} after the webhook and as null after
        # the policy (its JSONPatch result is converted back to the typed object, which
        # drops the empty map). Stored objects cannot differ so: an empty map is omitted.
        message = message.replace('"Limits":{}', '"Limits":null')
        message = REFUSED_BY.sub("", message)
    return {"status": response.status, "stored": stored, "message": message,
            "warnings": sorted(WARNED_BY.sub("", w.replace(namespace, "<ns>")) for w in warnings),
            "by_policy": by_policy}


def _wait_loaded(pool: urllib3.PoolManager, cluster: Cluster, roles: dict[str, dict[str, str]],
                 probe: dict[str, Any]) -> None:
    """Until the API server has loaded both paths: the probe's CPU limit is stripped in
    both plain namespaces."""
    refused = json.loads(json.dumps(probe))
    refused["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    deadline = time.monotonic() + 60
    while True:
        answers = [_answer(pool, cluster, probe, roles["plain"][which]) for which in ("webhook", "intree")]
        denials = [_answer(pool, cluster, refused, roles["plain"][which])
                   for which in ("webhook", "intree")]
        for denial in denials:
            denial.pop("by_policy")
        if all(a["stored"] and "limits" not in a["stored"]["spec"]["template"]["spec"]["containers"][0]
               ["resources"] for a in answers) and denials[0] == denials[1] and \
                denials[0]["status"] in (201, 403) and \
                _policy_answered(pool, cluster, refused, roles["plain"]["intree"]):
            return
        assert time.monotonic() < deadline, (
            f"the configurations were never loaded: {[(a['status'], a['message'][-700:]) for a in answers]}"
            f" refused probe: {denials}")
        time.sleep(0.5)


def _policy_answered(pool: urllib3.PoolManager, cluster: Cluster, obj: dict[str, Any],
                     namespace: str) -> bool:
    """The ValidatingAdmissionPolicy (not the webhook) refused or warned about ``obj``,
    and nothing else warned about it: its policy and the webhook's partition are loaded."""
    response = pool.request("POST", cluster.api_url + _path(obj, namespace),
                            body=json.dumps(obj).encode(),
                            headers={"Content-Type": "application/json"}, timeout=30)
    warnings = harness.warning_texts(response.headers)
    if response.status == 403:
        return "denied request: " in json.loads(response.data).get("message", "") and not warnings
    return len(warnings) == 1 and bool(WARNED_BY.match(warnings[0]))


def _limits(obj: dict[str, Any]) -> list[tuple[str, str, object]]:
    """Every limit of every resources block (the API server defaults no limit without a
    LimitRange, so a difference from what was written is Envelope's)."""
    found = []
    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "limits" and isinstance(value, dict):
                    found.extend((path, k, v) for k, v in value.items())
                else:
                    walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
    walk(obj.get("spec"), "spec")
    return sorted(found, key=str)


def _updated(obj: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``obj`` with another pod spec and template annotations."""
    out: dict[str, Any] = json.loads(json.dumps(obj))
    template = (out["spec"]["jobTemplate"]["spec"]["template"] if out["kind"] == "CronJob"
                else out["spec"]["template"])
    spec = _pod_spec(rng, ("RESOURCE_LIMITS", "APP_LIMITS", "RESOURCE_REQUESTS"))
    if out["kind"] in ("Job", "CronJob"):
        spec["restartPolicy"] = "Never"
    template["spec"] = spec
    annotations = _annotations(rng, ("envelope.io/keep-cpu-limit", "example.com/keep-cpu"))
    template.setdefault("metadata", {})["annotations"] = annotations
    return out


def _findings(message: str) -> list[tuple[str, str]] | None:
    """(message, rule) of each finding of a refusal, or None for another text."""
    found = [(m.group(1), m.group(2)) for m in FINDING.finditer(message)]
    return found if found and "".join(m.group(0) for m in FINDING.finditer(message)) == message else None


def _fewer_findings(webhook: dict[str, Any], intree: dict[str, Any]) -> bool:
    """A write that breaks a compiled rule *and* a rule only the webhook judges: refused
    on both paths, but the policy refuses first (ValidatingAdmissionPolicy runs before
    ValidatingAdmissionWebhook and the chain stops at the first refusal), so its message
    names only the compiled rule's findings, which are a contiguous part of the
    webhook's; the webhook's warnings for the other validate rules are then not given.
    Same status, same (no) stored object, a subset of the findings and of the warnings."""
    if webhook["status"] != intree["status"] or webhook["status"] != 403 or intree["stored"]:
        return False
    theirs, ours = _findings(webhook["message"]), _findings(intree["message"])
    compiled = set(COMPILABLE)
    return (theirs is not None and ours is not None and intree["message"] in webhook["message"]
            and {rule for _, rule in ours} <= compiled and len(ours) < len(theirs)
            and not Counter(intree["warnings"]) - Counter(webhook["warnings"]))


def _where(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Where two answers first differ, with the text around it."""
    x, y = json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)
    at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    around = slice(max(0, at - 300), at + 300)
    return f"first difference at {at}: webhook ...{x[around]}... in-tree ...{y[around]}..."


def differences(cluster: Cluster, name: str, roles: dict[str, dict[str, str]],
                objects: list[dict[str, Any]], rng: random.Random) -> tuple[list[str], Counter[str]]:
    """Every object written to both sets (in a namespace role drawn per object): the
    answers that differ, and a tally of what the answers were."""
    pool = urllib3.PoolManager(maxsize=8, ssl_context=cluster.admin_ssl_context())
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe"},
             "spec": {"selector": {"matchLabels": {"app": "p"}}, "template": {
                 "metadata": {"labels": {"app": "p"}}, "spec": {"containers": [
                     {"name": "c", "image": "registry.k8s.io/pause:3.10",
                      "resources": {"limits": {"cpu": "2"}}}]}}}}
    _wait_loaded(pool, cluster, roles, probe)
    placed = [(obj, rng.choice(list(roles))) for obj in objects]
    policy_answers = [0, 0]  # warned, refused by a ValidatingAdmissionPolicy
    counting = threading.Lock()

    def judge(item: tuple[dict[str, Any], str]) -> tuple[str | None, str]:
        obj, role = item
        webhook, intree = (_answer(pool, cluster, obj, roles[role][w]) for w in ("webhook", "intree"))
        assert not webhook.pop("by_policy"), "a ValidatingAdmissionPolicy answered the webhook set"
        by_policy = intree.pop("by_policy")
        if by_policy:
            with counting:
                policy_answers[by_policy == "refused"] += 1
        outcome = ("refused" if webhook["status"] != 201 else
                   "warned" if webhook["warnings"] else
                   "mutated" if _limits(webhook["stored"]) != _limits(obj) else "unchanged")
        if webhook != intree and _fewer_findings(webhook, intree):
            outcome = "refused, fewer findings in-tree"
        elif webhook != intree:
            return (f"{obj['kind']} {obj['metadata']['name']} in {role}:\n"
                    f"  {_where(webhook, intree)}\n"
                    f"  written: {json.dumps(obj)[:1500]}"), outcome
        if obj["kind"] == "Pod" or webhook["status"] != 201:
            return None, outcome
        # UPDATE: the object stored for real, then replaced (dry run) by one with another
        # pod spec and annotations (a Job's template is immutable: refused alike).
        for which in ("webhook", "intree"):
            assert _answer(pool, cluster, obj, roles[role][which], dry_run=False)["status"] == 201
        changed = _updated(obj, random.Random(obj["metadata"]["name"] + role))
        webhook, intree = (_answer(pool, cluster, changed, roles[role][w], update=True)
                           for w in ("webhook", "intree"))
        assert not webhook.pop("by_policy") and not intree.pop("by_policy"), \
            "a ValidatingAdmissionPolicy answered an UPDATE"
        if webhook == intree:
            return None, outcome + (" update" if webhook["status"] == 200 else " update refused")
        return (f"UPDATE of {obj['kind']} {obj['metadata']['name']} in {role}:\n"
                f"  {_where(webhook, intree)}\n"
                f"  written: {json.dumps(changed)[:1500]}"), outcome

    with ThreadPoolExecutor(8) as executor:
        results = list(executor.map(judge, placed))
    tally = Counter(o for _, o in results)
    tally["in-tree policy warned"], tally["in-tree policy refused"] = policy_answers
    return [d for d, _ in results if d], tally


@pytest.fixture(scope="module")
def webhooks(cluster: Cluster,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, harness.Webhook]]:
    """One Envelope webhook per policy, watching the cluster (the guards read quotas)."""
    running: dict[str, harness.Webhook] = {}
    try:
        for name, data in POLICIES.items():
            workdir = tmp_path_factory.mktemp(f"intree-{name}")
            config = workdir / "policy.yaml"
            config.write_text(yaml.safe_dump(data))
            running[name] = harness.start_webhook(workdir, kubeconfig=cluster.kubeconfig,
                                                  extra_args=["--config", str(config)])
        for hook in running.values():
            ctx = harness.tls_context(hook.ca_file)
            deadline = time.monotonic() + 60
            while harness.https_get(hook.url + "/readyz", ctx)[0] != 200:
                assert time.monotonic() < deadline, "the webhook never became ready"
                time.sleep(0.5)
        yield running
    finally:
        for hook in running.values():
            hook.stop()


def _apply(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))


def _delete(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    for manifest in manifests:
        cluster.kubectl("delete", manifest["kind"].lower(), manifest["metadata"]["name"],
                        "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.parametrize("name", list(POLICIES))
def test_in_tree_policy_answers_as_the_webhook(cluster: Cluster, webhooks: dict[str, harness.Webhook],
                                               name: str) -> None:
    policy = Policy.model_validate(POLICIES[name])
    manifests = configurations(name, policy, webhooks[name])
    roles = _namespaces(cluster, name, policy)
    _apply(cluster, manifests)
    try:
        objects = list(generate(random.Random(f"intree-{name}"), PER_POLICY))
        found, tally = differences(cluster, name, roles, objects, random.Random(f"roles-{name}"))
    finally:
        _delete(cluster, manifests)
    print(f"\n{name}: {len(objects)} objects, both paths alike: {dict(tally)}")
    assert not found, (f"{len(found)} of {len(objects)} writes answered differently in-tree "
                       f"(tally {dict(tally)}):\n" + "\n".join(found[:6]))
    # Not vacuous: each kind of answer is common.
    assert tally["mutated"] + tally["mutated update"] >= 20, tally
    assert tally["unchanged"] + tally["unchanged update"] >= 10, tally
    assert sum(n for outcome, n in tally.items() if outcome.endswith(" update")) >= 30, tally
    if name == "default":
        assert tally["refused"] >= 3, tally
        assert tally["warned"] + tally["warned update"] >= 10, tally
    if name == "memwarn":
        assert tally["in-tree policy warned"] >= 5, tally
    else:
        assert tally["in-tree policy refused"] >= 5, tally


def test_a_removed_clause_is_found(cluster: Cluster, webhooks: dict[str, harness.Webhook]) -> None:
    """The opt-out annotation's test removed from the patch: opted-out workloads lose their
    CPU limits in-tree, and the oracle says so."""
    name = "default"
    policy = Policy.model_validate(POLICIES[name])
    manifests = configurations("mutilated", policy, webhooks[name],
                               mutilate=("variables.optedOut ? [] : ", ""))
    manifests = json.loads(json.dumps(manifests).replace("!variables.optedOut && ", ""))
    roles = _namespaces(cluster, "mutilated", policy)
    _apply(cluster, manifests)
    try:
        objects = list(generate(random.Random("intree-mutilated"), PER_POLICY))
        plain = {"plain": roles["plain"]}  # where the policy runs
        found, _ = differences(cluster, "mutilated", plain, objects, random.Random("roles-mutilated"))
    finally:
        _delete(cluster, manifests)
    print(f"\nopt-out removed from the policy: {len(found)} of {len(objects)} writes differ")
    assert found, "removing the opt-out from the policy went unnoticed: the oracle is blind"


def test_a_removed_validating_clause_is_found(cluster: Cluster,
                                             webhooks: dict[str, harness.Webhook]) -> None:
    """The pod-level clause removed from the Warn policy's domain (in the policy and in
    the webhook's partition alike, as a compiler bug would): templates whose Pods get a
    pod-level memory request summed from their containers are judged in-tree as written,
    the webhook skips the rule for them, and the warning the webhook alone gives is lost."""
    name = "memwarn"
    policy = Policy.model_validate(POLICIES[name])
    manifests = configurations("vmutilated", policy, webhooks[name],
                               mutilate_validating=(pod_level_clause(), "true"))
    roles = _namespaces(cluster, "vmutilated", policy)
    _apply(cluster, manifests)
    try:
        objects = list(generate(random.Random("intree-vmutilated"), PER_POLICY))
        plain = {"plain": roles["plain"]}
        found, _ = differences(cluster, "vmutilated", plain, objects, random.Random("roles-vm"))
    finally:
        _delete(cluster, manifests)
    print(f"\npod-level clause removed from the Warn policy: {len(found)} of {len(objects)} "
          f"writes differ")
    assert found, "removing the pod-level clause went unnoticed: the oracle is blind"
