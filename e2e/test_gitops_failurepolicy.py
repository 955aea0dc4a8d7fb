"""A GitOps re-apply of the rendered webhook configurations (issue #26 item 5), on the
real API server: the chart's configurations (``helm template``, webhooks.safeInstall:
every webhook ``Ignore``, the wanted policies in the annotation) are applied the way
Argo CD's server-side sync does (``kubectl apply --server-side --force-conflicts
--field-manager argocd-controller``); an Envelope replica raises them; the same apply
again lowers them, and the replica — woken by its watch of the two configurations —
raises them again, counts the lowering in
``envelope_webhook_failure_policy_resets_total`` and exports
``envelope_webhook_failure_policy_lowered`` while one stays below. Measured: how long
the cluster stays lowered after each re-apply."""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

import harness
from harness import Cluster

RELEASE = "gitops-fp"
NAME = f"{RELEASE}-envelope"
WANTED = {"workloads.mutate.envelope.io": "Ignore", "workloads.validate.envelope.io": "Fail",
          "quotas.validate.envelope.io": "Fail", "actors.validate.envelope.io": "Fail"}
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


def rendered_configurations(cluster: Cluster, url: str, ca_file: Path) -> str:
    """The two webhook configurations as the chart renders them (what git holds)."""
    selector = json.dumps([{"key": "envelope.test/gitops-fp", "operator": "Exists"}])
    out = cluster.helm(
        "template", RELEASE, str(harness.CHART_DIR), "--namespace", "envelope-gitops-fp",
        "--set", "image.local=true",
        "--set", f"webhooks.url={url}", "--set", "certificates.mode=provided",
        "--set", "certificates.provided.secretName=unused-in-url-mode",
        "--set", f"certificates.provided.caBundle={base64.b64encode(ca_file.read_bytes()).decode()}",
        "--set-json", f"webhooks.namespaceSelectorExpressions={selector}").stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"].lower() in KINDS]
    assert len(docs) == 2, [d["kind"] for d in docs]
    return yaml.safe_dump_all(docs)


def gitops_sync(cluster: Cluster, manifests: str) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts",
                    "--field-manager", "argocd-controller", "-f", "-", input=manifests)


def policies(cluster: Cluster) -> dict[str, str]:
    out = {}
    for kind in KINDS:
        for hook in cluster.kubectl_json("get", kind, NAME)["webhooks"]:
            out[hook["name"]] = hook["failurePolicy"]
    return out


def metric(url: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith(name)}


class Watch:
    """The validating configuration's changes as the API server streams them, with the
    time each arrived: (monotonic seconds, the webhooks' failurePolicies)."""

    def __init__(self, cluster: Cluster) -> None:
        self.events: list[tuple[float, list[str]]] = []
        path = ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
                f"?watch=true&fieldSelector=metadata.name%3D{NAME}&timeoutSeconds=600")
        self.response = urllib.request.urlopen(cluster.api_url + path, timeout=600,
                                               context=cluster.admin_ssl_context())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.response:
                obj = json.loads(line)["object"]
                self.events.append((time.monotonic(),
                                    [w["failurePolicy"] for w in obj.get("webhooks") or []]))
        except (OSError, ValueError):
            return

    def lowered_then_raised(self, since: float, timeout: float = 30) -> tuple[float, float]:
        """When the first event after ``since`` showing Ignore where Fail is wanted
        arrived, and the next showing every wanted policy back."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            after = [(t, p) for t, p in self.events if t >= since]
            low = next((t for t, p in after if "Ignore" in p), None)
            if low is not None:
                up = next((t for t, p in after if t >= low and "Ignore" not in p), None)
                if up is not None:
                    return low, up
            time.sleep(0.05)
        raise AssertionError(f"no lowering and raise after {since}: {self.events[-5:]}")


def test_a_gitops_reapply_is_raised_again_and_counted(cluster: Cluster, tmp_path: Path) -> None:
    ca_file, cert_file, key_file = harness.make_serving_cert(tmp_path, name="gitops-fp")
    port, metrics_port = harness.free_port(), harness.free_port()
    manifests = rendered_configurations(cluster, f"https://127.0.0.1:{port}", ca_file)
    gitops_sync(cluster, manifests)
    server: Any = None
    try:
        assert set(policies(cluster).values()) == {"Ignore"}
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
               "PYTHONPATH": str(harness.REPO_ROOT)}
        server = harness.start_process(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--cert-file", str(cert_file), "--key-file", str(key_file),
             "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
             f"--mutating-webhook-configuration={NAME}",
             f"--validating-webhook-configuration={NAME}"],
            tmp_path / "serve.log", name="gitops-fp-webhook", env=env, cwd=harness.REPO_ROOT)
        started = time.monotonic()
        harness.wait_until("failure policies raised", lambda: policies(cluster) == WANTED,
                           server, timeout=60, interval=0.5)
        first = time.monotonic() - started
        watch = Watch(cluster)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        resets = "envelope_webhook_failure_policy_resets_total"
        measured = []
        for sync in (1, 2, 3):
            time.sleep(1)
            started = time.monotonic()
            gitops_sync(cluster, manifests)
            low, up = watch.lowered_then_raised(started)
            measured.append(round(up - low, 3))
            harness.wait_until(f"{resets} counts sync {sync}", lambda sync=sync: sum(
                metric(metrics_url, resets).values()) == sync, server, timeout=10, interval=0.2)
        lowered = metric(metrics_url, "envelope_webhook_failure_policy_lowered{")
        print(f"first raise {first:.2f} s; each re-apply lowered them (seen by a watch), "
              f"raised again after (s): {measured}")
        print(json.dumps({"lowered": lowered, "resets": metric(metrics_url, resets)}))
        # Every apply lowered them (the watch saw Ignore) and the replica's own watch
        # raised them again well within the 5 s check period it falls back to.
        assert all(s < 3 for s in measured), measured
        assert metric(metrics_url, resets) == {f'{resets}{{configuration="{NAME}"}}': 3.0}
        assert lowered and set(lowered.values()) == {0.0}, lowered  # none left below
        log = (tmp_path / "serve.log").read_text()
        assert "lowered again" in log, log[-2000:]
    finally:
        if server is not None:
            server.stop(timeout=10)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                        NAME, "--ignore-not-found", check=False)
