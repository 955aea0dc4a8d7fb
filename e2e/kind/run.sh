#!/usr/bin/env bash
# The e2e scenarios against a kind cluster, with Envelope built into an image and
# installed by its own chart. For users with Docker and kind; it cannot run on
# machines without a Docker engine (ours), where `make e2e` runs the same
# scenarios against a local kube-apiserver + etcd instead.
#
#   e2e/kind/run.sh            # create cluster, build, load, install, test, delete
#   KEEP=1 e2e/kind/run.sh     # keep the cluster afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER:-envelope-e2e}
IMAGE=${IMAGE:-envelope:e2e}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e/kind/run.sh needs $tool on PATH" >&2; exit 2; }
done
make -s install

work=$(mktemp -d)
cleanup() {
  [ "${KEEP:-}" = 1 ] || kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

kind create cluster --name "$CLUSTER" --wait 180s
kind get kubeconfig --name "$CLUSTER" >"$work/kubeconfig"
export KUBECONFIG="$work/kubeconfig"

docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

kubectl apply -f e2e/crds/
kubectl wait --for=condition=Established --timeout=60s -f e2e/crds/
# pod-fits-node is left to warn: kind's one node is smaller than the test pods.
helm install envelope charts/envelope --namespace envelope-system --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never --set replicaCount=1 --set priorityClassName="" \
  --set policy.rules.pod-fits-node=warn \
  --wait --timeout 300s

# The harness drives the kubectl and helm found here.
mkdir -p "$work/bin"
ln -s "$(command -v kubectl)" "$work/bin/kubectl"
ln -s "$(command -v helm)" "$work/bin/helm"
export PATH="$work/bin:$PATH"

# Scenarios that need no process of their own (outage, restart, certificate
# rotation and node-fit start local processes or fake Nodes; they stay local).
ENVELOPE_E2E_KUBECONFIG="$KUBECONFIG" .venv/bin/python -m pytest \
  e2e/test_workloads.py e2e/test_namespace_rules.py e2e/test_actors.py \
  -k "not fit_no_node" "$@"
