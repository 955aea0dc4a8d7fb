"""The mutating webhook's matchConditions (app/chart/matchconditions.py) never skip a write
that Envelope's /mutate would have changed, warned about or denied.

Differential, on the real kube-apiserver: a recording webhook is registered twice in one
MutatingWebhookConfiguration — ``all`` with no matchConditions (it records the
AdmissionReview the API server sends, after decoding and defaulting) and ``cond`` with
the generated matchConditions (it records that it was called). Both allow without a
patch, with ``failurePolicy: Fail``, so a CEL expression that errors on some object
fails its write and the test. Generated workloads of every kind are sent with
``dryRun=All``. For each, Envelope's mutate phase is evaluated in-process on the very
review ``all`` received (``parse_review`` + ``engine.evaluate``, as ``/mutate`` does),
under an empty cluster view and under one with a ResourceQuota on ``limits.cpu`` (so
the namespace guards report). A counterexample is a write ``cond`` was not called for
whose evaluation has a patch, a finding or an internal error. There must be none, and
both outcomes must be common (the test is not vacuous).

Run for the default policy, for one with other names and the guards off (there the
opt-out annotation is what decides the CPU part), and for one with ``memoryBelowLimit``.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import urllib3

import harness
from app.chart.matchconditions import mutate_match_conditions
from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import evaluate
from app.core.ruleset import default_ruleset
from app.serve.admission import parse_review
from harness import Cluster

pytestmark = pytest.mark.e2e

RULES = default_ruleset()
PER_POLICY = 300
CONFIG_NAME = "envelope-e2e-matchconditions"

POLICIES = {
    "default": Policy(),
    "renamed-no-guards": Policy.model_validate({
        "optOutAnnotation": "example.com/keep-cpu",
        "envelopeEnv": {"limits": "APP_LIMITS", "requests": "APP_REQUESTS"},
        "rules": {"quota-needs-cpu-limits": "off", "limitrange-needs-cpu-limits": "off"}}),
    # memory-below-limit everywhere (matchConditions see no namespace)
    "memory-below-limit": Policy.model_validate({"memoryBelowLimit": {"namespaces": ["*"]}}),
}

# --------------------------------------------------------------------- the recorder


class Recorder:
    """An HTTPS webhook answering allow (no patch) that keeps what it was sent."""

    def __init__(self, workdir: Path) -> None:
        self.reviews: dict[str, bytes] = {}  # object name -> the review body (path /all)
        self.called: set[str] = set()  # object names (path /cond)
        self.lock = threading.Lock()
        self.ca_file, cert, key = harness.make_serving_cert(workdir, ("127.0.0.1",), name="recorder")
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = json.loads(body)["request"]
                name = request["object"]["metadata"]["name"]
                with recorder.lock:
                    if self.path.split("?")[0] == "/all":
                        recorder.reviews[name] = body
                    else:
                        recorder.called.add(name)
                answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                     "response": {"uid": request["uid"], "allowed": True}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


WORKLOAD_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]},
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs", "cronjobs"],
     "operations": ["CREATE"]},
]


def recorder_configuration(recorder: Recorder, namespace: str, policy: Policy) -> dict[str, Any]:
    bundle = base64.b64encode(recorder.ca_file.read_bytes()).decode()

    def hook(name: str, path: str) -> dict[str, Any]:
        return {"name": f"{name}.recorder.envelope.test", "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 10,
                "reinvocationPolicy": "Never",
                "clientConfig": {"url": recorder.url + path, "caBundle": bundle},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "rules": WORKLOAD_RULES}

    conditioned = hook("cond", "/cond")
    conditioned["matchConditions"] = mutate_match_conditions(RULES, policy)
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME}, "webhooks": [hook("all", "/all"), conditioned]}


# ------------------------------------------------------------------- the generator

CPU = ["1", "2", "500m", "0.5", "250m", "7", "1500m"]
MEMORY = ["64Mi", "128Mi", "1Gi", "512Mi", "2G"]


def _resources(rng: random.Random, tidy: bool) -> dict[str, Any] | None:
    """A resources block; ``tidy`` draws from the shapes Envelope leaves alone (no CPU
    limit, no memory request without a limit)."""
    shape = rng.choice([0, 1, 5, 7, 8, 9]) if tidy else rng.randrange(13)
    cpu, mem = rng.choice(CPU), rng.choice(MEMORY)
    return [
        None,
        {},
        {"limits": {"cpu": cpu}},
        {"limits": {"cpu": cpu, "memory": mem}},
        {"limits": {"cpu": cpu, "memory": mem}, "requests": {"cpu": "100m", "memory": mem}},
        {"limits": {"memory": mem}, "requests": {"memory": mem}},
        {"requests": {"memory": mem}},
        {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
        {"limits": {"memory": mem}},
        {"requests": {"cpu": "100m"}, "limits": {"memory": mem, "ephemeral-storage": "1Gi"}},
        {"limits": {"ephemeral-storage": "1Gi"}, "requests": {"memory": mem}},
        {"limits": {"memory": "1Gi"}, "requests": {"memory": mem}},  # apart, unless mem is 1Gi
        {"limits": {"memory": "1024Mi"}, "requests": {"memory": "1Gi"}},  # equal, written apart
    ][shape]


def _env(rng: random.Random, names: tuple[str, ...], tidy: bool) -> list[dict[str, Any]] | None:
    choice = rng.randrange(8)
    if choice < 3:
        return None
    name = rng.choice(names)
    values = ["memory=1Gi", "", "garbage", "memory=2Gi,ephemeral=1Gi"]
    if not tidy:
        values += ["cpu=2,memory=1Gi", "CPU=1, memory=512Mi", "cpuset=0-3", "cpu=2", "memory=1Gi,cpu=500m"]
    value = rng.choice(values)
    env: list[dict[str, Any]] = [{"name": "OTHER", "value": "cpu=1,memory=1Gi"}]
    if choice == 7:
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    else:
        env.append({"name": name, "value": value} if value else {"name": name})
    return env


def _container(rng: random.Random, name: str, env_names: tuple[str, ...], tidy: bool) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    resources = _resources(rng, tidy and rng.random() < 0.9)
    if resources is not None:
        c["resources"] = resources
    env = _env(rng, env_names, tidy)
    if env is not None:
        c["env"] = env
    return c


def _annotations(rng: random.Random, keys: tuple[str, ...]) -> dict[str, str] | None:
    choice = rng.randrange(6)
    if choice < 3:
        return None
    return {rng.choice(keys): rng.choice(["true", " TRUE ", "false", "True", "yes"])}


def _pod_spec(rng: random.Random, env_names: tuple[str, ...]) -> dict[str, Any]:
    """Half the pods are drawn tidy (mostly shapes Envelope leaves alone), half anyhow."""
    tidy = rng.random() < 0.5
    spec: dict[str, Any] = {"containers": [_container(rng, f"c{i}", env_names, tidy)
                                           for i in range(rng.randint(1, 3))]}
    if rng.random() < 0.3:
        spec["initContainers"] = [_container(rng, f"init{i}", env_names, tidy)
                                  for i in range(rng.randint(1, 2))]
    if rng.random() < 0.15:
        choices = [{"limits": {"memory": "16Gi"}, "requests": {"memory": "16Gi"}}]
        if not tidy:
            choices += [{"limits": {"cpu": "8", "memory": "16Gi"}}, {"requests": {"memory": "8Gi"}}]
        spec["resources"] = rng.choice(choices)
    return spec


def generate(rng: random.Random, count: int, prefix: str) -> Iterator[dict[str, Any]]:
    """Workloads of every kind the webhook matches, resources drawn so that about half
    need nothing from Envelope's mutation."""
    keys = ("envelope.io/keep-cpu-limit", "example.com/keep-cpu", "envelope.io/exempt")
    env_names = ("RESOURCE_LIMITS", "APP_LIMITS", "RESOURCE_REQUESTS")
    labels = {"app": "mc"}
    for i in range(count):
        kind = rng.choice(["Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"])
        spec = _pod_spec(rng, env_names)
        meta: dict[str, Any] = {"name": f"{prefix}-{i}"}
        annotations = _annotations(rng, keys)
        if annotations:
            meta["annotations"] = annotations
        template: dict[str, Any] = {"metadata": {"labels": labels}, "spec": spec}
        template_annotations = _annotations(rng, keys)
        if template_annotations:
            template["metadata"]["annotations"] = template_annotations
        if kind == "Pod":
            if template_annotations:
                meta.setdefault("annotations", {}).update(template_annotations)
            yield {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
            continue
        if kind in ("Job", "CronJob"):
            spec["restartPolicy"] = "Never"
            template["metadata"] = {k: v for k, v in template["metadata"].items() if k != "labels"}
            job = {"template": template}
            if kind == "Job":
                yield {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job}
            else:
                yield {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
                       "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": job}}}
            continue
        body: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": template}
        if kind == "StatefulSet":
            body["serviceName"] = "mc"
        yield {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}


PLURAL = {"Pod": "pods", "Deployment": "deployments", "ReplicaSet": "replicasets",
          "StatefulSet": "statefulsets", "DaemonSet": "daemonsets", "Job": "jobs", "CronJob": "cronjobs"}


def dry_run_create(cluster: Cluster, namespace: str, objects: list[dict[str, Any]]) -> list[str]:
    """POST each object with dryRun=All; returns the failures that came from the
    recording webhooks (a CEL error, a refused call), not from validation."""
    pool = urllib3.PoolManager(maxsize=8, ssl_context=cluster.admin_ssl_context())

    def send(obj: dict[str, Any]) -> str | None:
        group_version = obj["apiVersion"]
        base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        url = f"{cluster.api_url}{base}/namespaces/{namespace}/{PLURAL[obj['kind']]}?dryRun=All"
        response = pool.request("POST", url, body=json.dumps(obj).encode(),
                                headers={"Content-Type": "application/json"}, timeout=30)
        text = response.data.decode(errors="replace")
        if response.status != 201 and ("recorder.envelope.test" in text or "matchCondition" in text
                                       or "admission webhook" in text):
            return f"{obj['kind']} {obj['metadata']['name']}: HTTP {response.status}: {text[:400]}"
        return None

    with ThreadPoolExecutor(8) as executor:
        return [f for f in executor.map(send, objects) if f]


def envelope_would_act(body: bytes, policy: Policy, namespace: str) -> list[str]:
    """What Envelope's /mutate would have answered for this review, under an empty view
    and under one where the namespace has a ResourceQuota on limits.cpu: every patch,
    finding and internal error."""
    _, subject = parse_review(body)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "cpu", "namespace": namespace},
             "spec": {"hard": {"limits.cpu": "100"}}}
    acts = []
    for label, view in (("empty view", StaticView()), ("quota view", StaticView([quota]))):
        result = evaluate(RULES, subject, view, policy, "mutate")
        if result.patch or result.findings or result.internal_errors:
            acts.append(f"{label}: patch={result.patch} findings={[f.as_dict() for f in result.findings]} "
                        f"internal={result.internal_errors}")
    return acts


@pytest.mark.parametrize("policy_name", list(POLICIES))
def test_skipped_writes_need_no_mutation(cluster: Cluster, tmp_path: Path, policy_name: str) -> None:
    policy = POLICIES[policy_name]
    namespace = harness.unique_name(f"e2e-mc-{policy_name}", max_length=40)
    cluster.create_namespace(namespace, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
    recorder = Recorder(tmp_path)
    try:
        cluster.apply(recorder_configuration(recorder, namespace, policy))
        rng = random.Random(f"matchconditions-{policy_name}")
        objects = list(generate(rng, PER_POLICY, "mc"))
        # The API server loads configurations asynchronously: probe until both hooks see writes.
        probe = copy.deepcopy(objects[0])

        def loaded() -> bool:
            probe["metadata"]["name"] = f"probe-{time.monotonic_ns()}"
            dry_run_create(cluster, namespace, [probe])
            return probe["metadata"]["name"] in recorder.reviews

        deadline = time.monotonic() + 30
        while not loaded():
            assert time.monotonic() < deadline, "the API server never called the recording webhook"
            time.sleep(0.5)
        failures = dry_run_create(cluster, namespace, objects)
        assert not failures, ("the recording webhooks refused writes (a CEL error?):\n"
                              + "\n".join(failures[:10]))
        names = [o["metadata"]["name"] for o in objects]
        missing = [n for n in names if n not in recorder.reviews]
        assert not missing, f"the API server never sent {len(missing)} objects, e.g. {missing[:5]}"
        skipped = [n for n in names if n not in recorder.called]
        counterexamples = []
        for name in skipped:
            acts = envelope_would_act(recorder.reviews[name], policy, namespace)
            if acts:
                review = json.loads(recorder.reviews[name])["request"]
                counterexamples.append(f"{review['kind']['kind']} {name}: skipped, but {acts}\n"
                                       f"  object: {json.dumps(review['object'])[:1500]}")
        called = [n for n in names if n in recorder.called]
        needed = sum(1 for n in called if envelope_would_act(recorder.reviews[n], policy, namespace))
        print(f"{policy_name}: {len(names)} writes, {len(skipped)} skipped by matchConditions, "
              f"{len(called)} sent ({needed} of them changed or reported on by /mutate)")
        assert not counterexamples, (f"{len(counterexamples)} counterexamples:\n"
                                     + "\n".join(counterexamples[:5]))
        # Not vacuous: both outcomes are common, and most calls are needed ones.
        assert len(skipped) >= PER_POLICY // 5, (len(skipped), len(called))
        assert len(called) >= PER_POLICY // 5, (len(skipped), len(called))
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIG_NAME, "--ignore-not-found",
                        check=False)
        recorder.stop()
