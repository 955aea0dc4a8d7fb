# `helm test`: one server-side dry-run write through the API server, which must reach
# both of Envelope's workload webhooks. Run by the chart's test Pod
# (templates/tests/dry-run.yaml) with the Envelope image's Python and `kubernetes`
# package, under a ServiceAccount that may only create Deployments in
# ENVELOPE_TEST_NAMESPACE. Always sent with dryRun=All: nothing is stored.
#
# The Deployment: one Guaranteed container with whole cores (cpu 2/2, memory 1Gi/1Gi)
# whose string envelopes disagree on memory (RESOURCE_LIMITS memory=2Gi,
# RESOURCE_REQUESTS memory=1Gi). With the default modes:
#   - the mutating webhook removes the CPU limit and warns that the pods lose their
#     exclusive cores: a Warning header "envelope[cpu-limits]: ...";
#   - the validating webhook refuses it: 403 'admission webhook
#     "workloads.validate.envelope.io" denied the request: ... [env-envelope-consistency]'.
# ENVELOPE_TEST_MODES (JSON, the chart's policy.rules) adapts the expectation when those
# rules are set to warn or off. Anything else fails the test and says why.
import json
import os
import sys

from kubernetes import client, config

VALIDATE = "workloads.validate.envelope.io"
DENIED = f'admission webhook "{VALIDATE}" denied the request'
MUTATE_RULE = "cpu-limits"
VALIDATE_RULE = "env-envelope-consistency"


def deployment(name: str) -> dict:
    container = {
        "name": "app", "image": "busybox",
        "env": [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=2Gi"},
                {"name": "RESOURCE_REQUESTS", "value": "cpu=2,memory=1Gi"}],
        "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                      "limits": {"cpu": "2", "memory": "1Gi"}},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container]}}}}


def expectations(modes: dict) -> tuple[bool, list[str]]:
    """(refused?, warnings that must be present) for the rules' modes."""
    mutate = modes.get(MUTATE_RULE, "enforce")
    validate = modes.get(VALIDATE_RULE, "enforce")
    warnings = [f"envelope[{MUTATE_RULE}]"] if mutate != "off" else []
    if validate == "warn":
        warnings.append(f"envelope[{VALIDATE_RULE}]")
    return validate == "enforce", warnings


def main() -> int:
    namespace = os.environ["ENVELOPE_TEST_NAMESPACE"]
    unjudged = os.environ.get("ENVELOPE_TEST_UNJUDGED")
    if unjudged:
        print(f"FAIL: nothing to test: {unjudged}; or set test.enabled=false")
        return 1
    modes = json.loads(os.environ.get("ENVELOPE_TEST_MODES") or "{}")
    refused, wanted = expectations(modes)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:  # outside a pod (the chart's e2e test): $KUBECONFIG
        config.load_kube_config()
    api = client.AppsV1Api()
    status, message, headers = 201, "", {}
    try:
        _, status, headers = api.create_namespaced_deployment_with_http_info(
            namespace, deployment("envelope-helm-test"), dry_run="All")
    except client.ApiException as exc:
        status, headers = exc.status, exc.headers or {}
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except ValueError:
            message = str(exc.body)
    warnings = headers.get("Warning", "") if headers else ""
    problems = []
    if refused and not (status == 403 and DENIED in message and f"[{VALIDATE_RULE}]" in message):
        problems.append(f"expected HTTP 403 '{DENIED}: ... [{VALIDATE_RULE}]', got HTTP {status}"
                        + (f": {message}" if message else " (accepted)"))
    if not refused and status >= 400:
        problems.append(f"expected the dry run to be accepted ({VALIDATE_RULE} is "
                        f"{modes.get(VALIDATE_RULE)}), got HTTP {status}: {message}")
    problems += [f"expected a warning '{w}: ...' from Envelope, got: {warnings or 'none'}"
                 for w in wanted if w not in warnings]
    where = f"the dry-run Deployment in namespace {namespace}"
    if not problems:
        print(f"ok: Envelope judged {where} (HTTP {status})")
        for line in (message, warnings):
            if line:
                print(f"  {line}")
        return 0
    print(f"FAIL: {where} was not judged as expected:")
    for problem in problems:
        print(f"  - {problem}")
    if "failed calling webhook" in message:
        print("  The API server could not call Envelope: see docs/troubleshooting.md.")
    elif status < 400 and refused:
        print(f"  Envelope did not see it: the webhooks are still failurePolicy Ignore and cannot "
              f"reach Envelope, or namespace {namespace} is excluded (webhooks.excludeNamespaces; "
              f"set test.namespace to a namespace Envelope judges).")
    return 1


if __name__ == "__main__":
    sys.exit(main())
