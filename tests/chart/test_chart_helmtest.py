"""The chart's ``helm test`` hook (templates/tests/dry-run.yaml, files/helm-test.py).

Offline: what is rendered (only with tests, never into the release or the plain
manifests), least privilege, a pod that follows the chart's hardening and our own
resource rule, the script the Pod runs is the file in the chart.

Real part (``e2e``): the chart installed in URL mode with the real server (as in
tests/chart/test_chart.py), the hook's ServiceAccount, Role and RoleBinding applied, and the
Pod's exact command run with that ServiceAccount's token against the API server: it
passes while Envelope serves, fails (saying why) when Envelope is gone, and the token
can do nothing but create Deployments in the test namespace. The kubelet is the only
part not exercised: the harness has none, so the Pod itself is not scheduled.
"""

from __future__ import annotations

import base64
import json
import os
import runpy
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers.chart import (
    CHART,
    KUBE_VERSION,
    MANIFEST,
    NAMESPACE,
    REPO,
    STANDARD_LABELS,
    _ca_bundles,
    _sa_kubeconfig,
    _wait,
    render,
)

SCRIPT = CHART / "files" / "helm-test.py"
HOOK = "helm.sh/hook"


def hook_docs(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return [d for d in render(values, tests=True, **kw).docs
            if (d["metadata"].get("annotations") or {}).get(HOOK) == "test"]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind]
    return found


def test_only_test_hooks_are_added_and_never_to_the_release() -> None:
    with_tests, without = render(tests=True).docs, render().docs
    added = [d for d in with_tests if d not in without]
    assert sorted(d["kind"] for d in added) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    for doc in added:
        annotations = doc["metadata"]["annotations"]
        assert annotations[HOOK] == "test", doc["metadata"]["name"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert not [d for d in without if HOOK in (d["metadata"].get("annotations") or {})]
    assert HOOK not in MANIFEST.read_text()
    assert hook_docs({"test": {"enabled": False}}) == []


def test_hook_objects_are_valid_and_labelled() -> None:
    for doc in hook_docs(namespace="guard", release="guard"):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        labels = doc["metadata"]["labels"]
        for label in STANDARD_LABELS:
            assert labels.get(label), f"{doc['kind']} lacks {label}"
        assert labels["app.kubernetes.io/component"] == "test"
        assert doc["metadata"]["name"] == "guard-envelope-test"


def test_least_privilege() -> None:
    docs = hook_docs()
    role, binding, sa = one(docs, "Role"), one(docs, "RoleBinding"), one(docs, "ServiceAccount")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    assert sa["metadata"]["namespace"] == NAMESPACE and sa["automountServiceAccountToken"] is False
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    # Weights: the RBAC exists before the Pod starts.
    weights = {d["kind"]: int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")) for d in docs}
    assert weights["Pod"] > weights["RoleBinding"] > weights["Role"]
    assert one(hook_docs({"test": {"namespace": "team-a"}}), "Role")["metadata"]["namespace"] == "team-a"


def test_pod_runs_the_chart_script_hardened_and_by_our_own_rule() -> None:
    rendered = render(tests=True)
    pod = one(hook_docs(), "Pod")
    spec = pod["spec"]
    [container] = spec["containers"]
    assert container["image"] == rendered.container["image"]  # the chart's own image
    assert container["command"] == ["python", "-c"] and container["args"] == [SCRIPT.read_text()]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == one(hook_docs(), "ServiceAccount")["metadata"]["name"]
    assert container["securityContext"] == rendered.container["securityContext"]
    assert spec["securityContext"] == rendered.pod_spec["securityContext"]
    resources = container["resources"]
    assert "cpu" not in resources["limits"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"ENVELOPE_TEST_NAMESPACE": "default", "ENVELOPE_TEST_MODES": "{}"}
    # Not selected by the webhook's Service, PDB or spread constraints.
    selector = rendered.one("Service")["spec"]["selector"]
    assert not all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())


@pytest.mark.parametrize(("values", "why"), [
    ({"webhooks": {"excludeNamespaces": ["default"]}}, 'test.namespace "default" is never sent'),
    ({"test": {"namespace": NAMESPACE}}, f'test.namespace "{NAMESPACE}" is never sent'),
    ({"webhooks": {"workloads": {"enabled": False}}}, "webhooks.workloads.enabled is false"),
])
def test_settings_that_cannot_be_tested_fail_the_pod_not_the_install(values: dict[str, Any],
                                                                     why: str) -> None:
    [container] = one(hook_docs(values), "Pod")["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert why in env["ENVELOPE_TEST_UNJUDGED"]
    assert render(values).one("Deployment")  # the install itself renders
    proc = subprocess.run([sys.executable, "-c", container["args"][0]], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 1 and "FAIL: nothing to test" in proc.stdout, proc.stdout + proc.stderr


def test_expectations_follow_the_rule_modes() -> None:
    expectations = runpy.run_path(str(SCRIPT), run_name="helm_test")["expectations"]
    assert expectations({}) == (True, ["envelope[cpu-limits]"])
    assert expectations({"env-envelope-consistency": "warn"}) == (
        False, ["envelope[cpu-limits]", "envelope[env-envelope-consistency]"])
    assert expectations({"cpu-limits": "off", "env-envelope-consistency": "off"}) == (False, [])
    pod = one(hook_docs({"policy": {"rules": {"cpu-limits": "warn"}}}), "Pod")
    modes = pod["spec"]["containers"][0]["env"]
    assert {"name": "ENVELOPE_TEST_MODES", "value": '{"cpu-limits":"warn"}'} in modes


def test_the_dry_run_object_gets_the_expected_answers_offline(tmp_path: Path) -> None:
    """The object the script sends: `envelope check` finds the warning and the error the
    script expects from the webhooks (the same rules, offline)."""
    deployment = runpy.run_path(str(SCRIPT), run_name="helm_test")["deployment"]("envelope-helm-test")
    path = tmp_path / "d.json"
    path.write_text(json.dumps(deployment))
    proc = subprocess.run([sys.executable, "-m", "app", "check", "-f", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "warning cpu-limits: pods become Burstable" in proc.stdout, proc.stdout
    assert "error   env-envelope-consistency:" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------ e2e



def _run_pod_command(pod: dict[str, Any], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """The test Pod's container command, run here under the given kubeconfig."""
    [container] = pod["spec"]["containers"]
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update({e["name"]: e["value"] for e in container["env"]})
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([sys.executable, *container["command"][1:], *container["args"]],
                          capture_output=True, text=True, env=env, timeout=120)


class Installed:
    """The chart installed in URL mode (release ``guard``), and the real server started
    exactly as the pod would start it, under the chart's ServiceAccount token."""

    ns = release = "guard"
    name = "guard-envelope"

    def __init__(self, cluster: Any, tmp_path: Path) -> None:
        import harness

        self.cluster, self.tmp = cluster, tmp_path
        self.port, metrics_port = harness.free_port(), harness.free_port()
        self.settings = ["--set", f"webhooks.url=https://127.0.0.1:{self.port}",
                         "--set", "certificates.extraSANs={127.0.0.1}",
                         "--set", f"port={self.port}", "--set", f"metrics.port={metrics_port}"]
        self.install = cluster.helm("install", self.release, str(CHART), "--set", "image.local=true",
                                    "-n", self.ns,
                                    "--create-namespace", *self.settings)
        deployment = cluster.kubectl_json("get", "deployment", self.name, "-n", self.ns)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config = cluster.kubectl_json("get", "configmap", f"{self.name}-config", "-n", self.ns)
        (tmp_path / "policy.yaml").write_text(config["data"]["policy.yaml"])
        args = [a.replace("$(POD_NAMESPACE)", self.ns) for a in container["args"]]
        self.args = [f"--config={tmp_path / 'policy.yaml'}" if a.startswith("--config=") else
                     "--host=127.0.0.1" if a.startswith("--host=") else a for a in args]
        server_sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        self.kubeconfig = _sa_kubeconfig(cluster, self.ns, server_sa, tmp_path / "server.kubeconfig")
        self.server: Any = None

    def serve(self) -> None:
        """Start the server; return once it is ready (caBundle injected) and the
        validating webhooks are raised to Fail (webhooks.safeInstall)."""
        import harness

        env = {**os.environ, "POD_NAME": f"{self.name}-test-0", "POD_NAMESPACE": self.ns,
               "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "KUBECONFIG": str(self.kubeconfig)}
        env.pop("ENVELOPE_CONFIG", None)
        self.server = harness.start_process(
            [sys.executable, "-m", "app", *self.args, f"--kubeconfig={self.kubeconfig}", "--tls-interval=1"],
            self.tmp / "webhook.log", name="webhook", env=env, cwd=REPO)

        def ready() -> bool:
            bundle = _ca_bundles(self.cluster, self.name).get("workloads.validate.envelope.io", "")
            if not bundle:
                return False
            context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/readyz", context=context,
                                            timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        _wait("the webhook ready with its caBundle injected", ready, self.server)
        _wait("the validating webhooks raised to Fail", lambda: self.policies() == {"Fail"}, self.server)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(timeout=15)
            self.server = None

    def policies(self) -> set[str]:
        config = self.cluster.kubectl_json("get", "validatingwebhookconfiguration", self.name)
        return {h["failurePolicy"] for h in config["webhooks"]}


@pytest.fixture()
def installed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Installed]:
    # test_chart's fresh etcd + kube-apiserver, imported below under its own name
    chart = Installed(request.getfixturevalue("cluster"), tmp_path)
    try:
        yield chart
    finally:
        chart.stop()


@pytest.mark.e2e
def test_helm_test_pod_command_against_the_real_api_server(installed: Installed) -> None:
    cluster, ns, release, name = installed.cluster, installed.ns, installed.release, installed.name
    tmp_path = installed.tmp
    install = installed.install
    # NOTES.txt: the helm test step, where metrics are, the troubleshooting page (absolute).
    assert f"helm test {release} -n {ns} --logs" in install.stdout, install.stdout
    assert f"port-forward deployment/{name} " in install.stdout
    assert "docs/troubleshooting.md in Envelope's source (set links.docsBaseURL for a link)" in install.stdout
    # the webhooks as installed: Ignore until a replica is ready (webhooks.safeInstall)
    assert "validate: Ignore until a replica is ready, then Fail" in install.stdout, install.stdout

    # The hook's objects as Helm stored them for `helm test` (the Pod's command is run below).
    stored = [d for d in yaml.safe_load_all(cluster.helm("get", "hooks", release, "-n", ns).stdout) if d]
    hooks = {d["kind"]: d for d in stored}
    assert sorted(hooks) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(hooks[kind]))
    sa = hooks["ServiceAccount"]["metadata"]["name"]
    test_kubeconfig = _sa_kubeconfig(cluster, ns, sa, tmp_path / "test.kubeconfig")

    # Least privilege, as the API server's authorizer sees it.
    def can(*what: str) -> bool:
        proc = cluster.kubectl("auth", "can-i", *what, f"--as=system:serviceaccount:{ns}:{sa}", check=False)
        return proc.stdout.strip() == "yes"

    assert can("create", "deployments.apps", "-n", "default")
    for what in (("get", "deployments.apps", "-n", "default"),
                 ("delete", "deployments.apps", "-n", "default"),
                 ("create", "pods", "-n", "default"), ("create", "deployments.apps", "-n", "kube-system"),
                 ("create", "deployments.apps", "-n", ns), ("list", "secrets", "-n", ns)):
        assert not can(*what), what

    # Before any replica served: the webhooks are Ignore and nothing answers.
    proc = _run_pod_command(hooks["Pod"], test_kubeconfig)
    assert proc.returncode == 1 and "Envelope did not see it" in proc.stdout, proc.stdout

    installed.serve()
    proc = _run_pod_command(hooks["Pod"], test_kubeconfig)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok: Envelope judged the dry-run Deployment in namespace default")
    assert 'admission webhook "workloads.validate.envelope.io" denied the request' in proc.stdout
    assert "envelope[cpu-limits]: pods become Burstable" in proc.stdout
    installed.stop()
    # Nothing was stored.
    assert cluster.kubectl("get", "deployment", "envelope-helm-test", "-n", "default",
                           check=False).returncode != 0
    # Envelope gone: the test fails, and says why.
    proc = _run_pod_command(hooks["Pod"], test_kubeconfig)
    assert proc.returncode == 1, proc.stdout
    assert "FAIL: the dry-run Deployment in namespace default was not judged as expected" in proc.stdout
    assert "failed calling webhook" in proc.stdout and "docs/troubleshooting.md" in proc.stdout


def _troubleshooting_block(after: str, installed: Installed) -> str:
    """The first ```sh block after ``after`` in troubleshooting.md, with the chart's
    default names replaced by the test release's."""
    text = (REPO / "docs" / "troubleshooting.md").read_text()
    start = text.index(after)
    block = text[text.index("```sh\n", start) + len("```sh\n"):]
    block = block[:block.index("```")]
    block = block.replace("webhookconfiguration envelope", f"webhookconfiguration {installed.name}")
    return block.replace("helm upgrade envelope <chart> -n envelope-system",
                         f"helm upgrade {installed.release} {CHART} -n {installed.ns}")


@pytest.mark.e2e
def test_the_kill_switch_fails_open_sticks_and_is_undone(installed: Installed) -> None:
    """docs/troubleshooting.md's kill switch, run as written on the real API server with
    the real server: a bare patch of failurePolicy is raised back; each documented way
    to fail open stays Ignore while Envelope serves and lets writes through once it is
    gone; the documented way back restores enforcement."""
    cluster, name = installed.cluster, installed.name
    bad = json.dumps(runpy.run_path(str(SCRIPT), run_name="helm_test")["deployment"]("kill-switch"))

    def refused() -> bool:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", "default", "-f", "-", input=bad,
                               check=False)
        assert proc.returncode == 0 or "denied the request" in proc.stderr, proc.stderr
        return proc.returncode != 0

    def sh(block: str) -> None:
        env = {**os.environ, "PATH": f"{cluster.bin_dir}:{os.environ['PATH']}",
               "KUBECONFIG": str(cluster.kubeconfig)}
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True, text=True,
                              env=env, timeout=120, cwd=REPO)
        assert proc.returncode == 0, block + proc.stdout + proc.stderr

    def stays_ignore() -> None:
        assert installed.policies() == {"Ignore"}
        time.sleep(12)  # more than two of the replicas' 5 s checks
        assert installed.policies() == {"Ignore"}, "the replicas raised the kill switch back"

    installed.serve()
    assert refused()
    # The trap: failurePolicy alone is raised back by the replicas within seconds.
    cluster.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json",
                    "-p", '[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]')
    _wait("the bare patch raised back to Fail", lambda: installed.policies() == {"Fail"}, installed.server)

    # With Helm: stays Ignore while Envelope serves (which still judges every write),
    # writes pass once it is gone; back to enforcing, raised again once it serves.
    sh(_troubleshooting_block("**Fail open with Helm**", installed))
    stays_ignore()
    assert refused()
    installed.stop()
    assert not refused(), "with Envelope gone and the webhooks Ignore, writes should pass"
    sh(_troubleshooting_block("**Back to enforcing**", installed))
    installed.serve()
    assert refused()

    # Without Helm, the same; back with the same helm upgrade.
    block = _troubleshooting_block("**Without Helm**", installed)
    assert "kubectl replace -f -" in block
    sh(block)
    stays_ignore()
    installed.stop()
    assert not refused(), "with Envelope gone and the webhooks Ignore, writes should pass"
    sh(_troubleshooting_block("**Back to enforcing**", installed))
    installed.serve()
    assert refused()
