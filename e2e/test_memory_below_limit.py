"""Stacks the platform does not own, through the real API server with Envelope enforcing
(issue 35, point 1): kube-prometheus and three widely used charts rendered with their
default values (tests/data/thirdparty/, README there) set memory requests below their
limits. An Envelope webhook of this test's own, with the policy

    memoryBelowLimit: {namespaceSelector: {matchLabels: {envelope.test/memory: raise-request}}}

serves namespaces labelled for it (the session's webhook leaves them alone). Each stack is
applied object by object with ``kubectl apply --server-side --dry-run=server``:

- in a namespace without the memory label, Envelope refuses every workload with a memory
  request below its limit (``memory-request-equals-limit``);
- in one with it, none is refused: the mutating webhook raised the requests;
- what the API server would store there equals what ``envelope fix --memory
  raise-request`` writes into the file (every field the fixed file sets, as stored), and
  storing the fixed file in the namespace without the label stores the same objects.

The numbers are printed and recorded in docs/gitops.md ("Stacks you do not own").
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
from app.chart.matchconditions import mutate_match_conditions
from app.cli import main
from app.cluster.static import Loaded, load_text, split_documents
from app.core.config import Policy
from app.core.ruleset import default_ruleset
from app.k8s.quantity import QuantityError, parse_quantity
from harness import Cluster

pytestmark = pytest.mark.e2e

THIRDPARTY = Path(__file__).resolve().parent.parent / "tests" / "data" / "thirdparty"
STACKS = sorted(THIRDPARTY.glob("*.yaml"))
SERVED = "envelope.test/day1mem"
MEMORY = "envelope.test/memory"
POLICY = {"memoryBelowLimit": {"namespaceSelector": {"matchLabels": {MEMORY: "raise-request"}}}}
VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")
RESOURCES = ["pods", "replicationcontrollers", "deployments", "replicasets", "statefulsets",
             "daemonsets", "jobs", "cronjobs"]


def _hook(name: str, url: str, bundle: str, conditions: list[dict[str, Any]] | None) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Fail", "timeoutSeconds": 10,
        "clientConfig": {"url": url, "caBundle": bundle},
        "namespaceSelector": {"matchLabels": {SERVED: "true"}},
        "rules": [{"apiGroups": ["", "apps", "batch"], "apiVersions": ["v1"],
                   "operations": ["CREATE", "UPDATE"], "scope": "Namespaced",
                   "resources": RESOURCES}]}
    if conditions is not None:
        hook["reinvocationPolicy"] = "IfNeeded"
        hook["matchConditions"] = conditions
    return hook


@pytest.fixture(scope="module")
def envelope(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Webhook]:
    """Envelope with POLICY, registered (mutating with the generated matchConditions,
    validating) for namespaces labelled SERVED."""
    work = tmp_path_factory.mktemp("day1mem")
    config = work / "policy.yaml"
    config.write_text(json.dumps(POLICY))
    webhook = harness.start_webhook(work / "webhook", kubeconfig=cluster.kubeconfig,
                                    extra_args=["--staleness", "5", "--config", str(config)])
    name = "envelope-e2e-day1mem"
    bundle = base64.b64encode(webhook.ca_file.read_bytes()).decode()
    conditions = mutate_match_conditions(default_ruleset(), Policy.model_validate(POLICY))
    configurations = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": name},
         "webhooks": [_hook("mutate.day1mem.envelope.test", webhook.url + "/mutate", bundle, conditions)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": name},
         "webhooks": [_hook("validate.day1mem.envelope.test", webhook.url + "/validate", bundle, None)]}]
    try:
        for manifest in configurations:
            cluster.apply(manifest)
        yield webhook
    finally:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        webhook.stop()


def _namespace(cluster: Cluster, prefix: str, raise_memory: bool) -> str:
    name = harness.unique_name(prefix, max_length=40)
    labels = {harness.ISOLATED_NAMESPACE_LABEL: "true", SERVED: "true"}
    if raise_memory:
        labels[MEMORY] = "raise-request"
    cluster.create_namespace(name, labels=labels)
    return name


def _documents(text: str) -> list[str]:
    return [chunk for _, chunk, problem in split_documents(text) if chunk.strip() and not problem
            and re.search(r"(?m)^kind: ", chunk)]


def _in(text: str, original: str, namespace: str) -> str:
    """The stack's text with its namespace renamed (the same bytes otherwise)."""
    return re.sub(rf"(?m)^(\s+namespace: ){re.escape(original)}$", rf"\g<1>{namespace}", text)


def _apply(cluster: Cluster, tmp: Path, docs: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each document through ``kubectl apply --server-side --dry-run=server``: what the API
    server would store, and Envelope's refusals (kubectl's error text)."""
    stored, refused = [], []
    for i, doc in enumerate(docs):
        path = tmp / f"doc-{i}.yaml"
        path.write_text(doc)
        done = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-o", "json",
                               "-f", str(path), check=False)
        if done.returncode != 0:
            assert "denied the request" in done.stderr, done.stderr  # only Envelope refuses
            refused.append(done.stderr.strip())
            continue
        uid = json.loads(done.stdout)["metadata"]["uid"]
        obj = json.loads(done.stdout.replace(uid, "UID"))  # a Job's selector holds its uid
        for key in VOLATILE:
            obj["metadata"].pop(key, None)
        stored.append(obj)
    return stored, refused


def _within(part: Any, whole: Any, where: str = "") -> list[str]:
    """Where ``part`` (an object as the file writes it) is not in ``whole`` (as stored),
    up to how the API server serialises: empty and false values are omitted (``omitempty``:
    ``hostNetwork: false``, ``value: ""``), a null is defaulted (``replicas: null`` -> 1),
    and quantities are written canonically (``1024Mi`` -> ``1Gi``)."""
    if part is None or part is False or part in ("", {}, []):
        return []
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [where]
        return [p for k, v in part.items() for p in
                (_within(v, whole[k], f"{where}.{k}") if k in whole else
                 [] if v is None or v is False or v in ("", {}, []) else [f"{where}.{k} missing"])]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) != len(whole):
            return [where]
        return [p for i, (a, b) in enumerate(zip(part, whole, strict=True))
                for p in _within(a, b, f"{where}[{i}]")]
    if part == whole or str(part) == str(whole) or _same_quantity(part, whole):
        return []
    return [f"{where}: {part!r} != {whole!r}"]


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(str(a)) == parse_quantity(str(b))
    except QuantityError:
        return False


def _renamed(objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    text = json.dumps(objs)
    return json.loads(text.replace(json.dumps(namespace)[1:-1], "NS"))


@pytest.mark.parametrize("stack", STACKS, ids=[p.stem for p in STACKS])
def test_a_stack_you_do_not_own_goes_through_with_raised_requests(
        cluster: Cluster, envelope: harness.Webhook, stack: Path, tmp_path: Path) -> None:
    text = stack.read_text()
    original = re.search(r"(?m)^\s+namespace: (\S+)$", text)
    assert original is not None
    kept = _namespace(cluster, "e2e-mem-off", raise_memory=False)
    raised = _namespace(cluster, "e2e-mem-on", raise_memory=True)
    docs_kept = _documents(_in(text, original.group(1), kept))
    docs_raised = _documents(_in(text, original.group(1), raised))

    stored_kept, refused_kept = _apply(cluster, tmp_path, docs_kept)
    assert refused_kept and all("memory-request-equals-limit" in r for r in refused_kept)
    assert len(stored_kept) + len(refused_kept) == len(docs_kept)
    stored_raised, refused_raised = _apply(cluster, tmp_path, docs_raised)
    assert refused_raised == []
    assert len(stored_raised) == len(docs_raised)

    # envelope fix --memory raise-request on the same file writes what was stored
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(_in(text, original.group(1), raised))
    assert main(["fix", "--memory", "raise-request", str(fixed)]) == 0
    fixed_docs = _documents(fixed.read_text())
    loaded = Loaded()
    load_text(fixed.read_text(), str(fixed), loaded)
    written = [m.obj for m in loaded.manifests]
    differing = [(w["kind"], w["metadata"]["name"], _within(w, s)[:3])
                 for w, s in zip(written, stored_raised, strict=True) if _within(w, s)]
    assert differing == [], differing
    # and storing the fixed file where nothing is raised stores the same objects
    kept_fixed = [doc.replace(f"namespace: {raised}", f"namespace: {kept}") for doc in fixed_docs]
    stored_fixed, refused_fixed = _apply(cluster, tmp_path, kept_fixed)
    assert refused_fixed == []
    assert _renamed(stored_fixed, kept) == _renamed(stored_raised, raised)
    print(f"\n{stack.stem}: {len(docs_raised)} objects; refused without memoryBelowLimit: "
          f"{len(refused_kept)}; with it: {len(refused_raised)}; stored == fix --memory "
          f"raise-request: {len(written) - len(differing)}/{len(written)}; the fixed file stored "
          f"where nothing is raised: {len(stored_fixed)} objects, identical")
