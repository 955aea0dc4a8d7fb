"""pytest fixtures for end-to-end tests against a real kube-apiserver.

Fixtures (see e2e/harness/ for the objects they return):

- ``controlplane_bin_dir`` (session) -> Path: etcd, kube-apiserver, kubectl, helm.
- ``cluster`` (session) -> harness.Cluster: etcd + kube-apiserver running.
- ``namespace`` (function) -> str: a fresh, uniquely named namespace.
- ``scheduler`` (session) -> harness.Scheduler: kube-scheduler against ``cluster``,
  scheduling only Pods with ``spec.schedulerName: envelope-oracle`` onto Node
  objects the tests create (``Cluster.create_node``). Started on first request.
- ``webhook`` (session) -> harness.Webhook: ``python -m app serve`` running and
  registered as the cluster's mutating + validating webhook. Only tests that
  request it start it; once started it stays registered for the rest of the
  session (every namespace but kube-system).

- ``node_env`` -> NodeEnv (``node_session``, emptied after each test): a control plane of
  its own with a real node (containerd + kubelet, e2e/harness/node.py),
  kube-controller-manager (workloads and the node lifecycle controller), kube-scheduler
  (``default-scheduler`` too) and the webhook; started on first request, torn down
  leaving nothing (the fixture fails otherwise).

A control plane that cannot be built or started fails the tests; it is never
skipped.

Order: a test marked ``@pytest.mark.last`` (or a module with ``pytestmark =
pytest.mark.last``) runs after every other test of the session, in collection order
among themselves: ``test_apiserver_restart.py`` takes the shared API server away, and
``test_caller_token.py`` waits on a kube-apiserver built in the background.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, MutableSequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import Cluster, HarnessError, Webhook

pytest.register_assert_rewrite("builders")  # the scenarios' shared objects and waits

E2E_DIR = Path(__file__).resolve().parent
T = TypeVar("T")


def _or_fail(fn: Callable[[], T]) -> T:
    """Run ``fn``; turn a HarnessError into a plain test failure (never a skip)."""
    try:
        return fn()
    except HarnessError as err:
        message = str(err)
    # Outside the except block, so the report is not a chained traceback.
    pytest.fail(message, pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("envelope oracles")
    group.addoption("--cases", type=int, default=None, metavar="N",
                    help="cases per differential oracle (e2e/test_oracle_*.py); default: the CI subset")
    group.addoption("--oracle-seed", type=int, default=12, metavar="SEED",
                    help="seed of the oracles' case generators (default 12)")
    group.addoption("--oracle-fraction", type=float, default=1.0, metavar="F",
                    help="run this fraction of each oracle's CI cases (the second Kubernetes minor "
                         "of the version matrix runs a seeded subset: make e2e-second)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test against a real etcd + kube-apiserver (built by e2e/controlplane/build.sh)",
    )
    config.addinivalue_line(
        "markers",
        "last: runs after every other test of the session (it disturbs the shared control plane, "
        "or needs a tool built in the background meanwhile)",
    )


class _Marked(Protocol):
    def get_closest_marker(self, name: str) -> object | None: ...


M = TypeVar("M", bound=_Marked)


def run_last(items: MutableSequence[M]) -> None:
    """Move the items marked ``last`` to the end, keeping the order within each part."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("last") is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
    run_last(items)


@pytest.fixture(scope="session")
def controlplane_bin_dir(request: pytest.FixtureRequest) -> Path:
    """Directory with the control-plane binaries ($ENVELOPE_CONTROLPLANE_BIN or
    built/cached by e2e/controlplane/build.sh). Fails, never skips."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        return _or_fail(harness.locate_bin_dir)
    # Let build.sh's progress through: a cold build takes several minutes.
    with capman.global_and_fixture_disabled():
        return _or_fail(harness.locate_bin_dir)


#: Run the scenarios against an existing cluster with Envelope installed (e2e/kind/run.sh).
EXTERNAL_KUBECONFIG = os.environ.get("ENVELOPE_E2E_KUBECONFIG")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running etcd + kube-apiserver for the whole session (or, with
    ENVELOPE_E2E_KUBECONFIG, the cluster that kubeconfig names)."""
    workdir = tmp_path_factory.mktemp("controlplane")
    if EXTERNAL_KUBECONFIG:
        yield _or_fail(lambda: harness.external_cluster(Path(EXTERNAL_KUBECONFIG), workdir))
        return
    controlplane_bin_dir = request.getfixturevalue("controlplane_bin_dir")
    running = _or_fail(lambda: harness.start_control_plane(workdir, controlplane_bin_dir))
    try:
        harness.install_crds(running)
        yield running
    finally:
        running.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test. It is not deleted afterwards:
    without controllers a namespace never finishes terminating."""
    name = harness.unique_name(f"e2e-{request.node.name}", max_length=50)
    cluster.create_namespace(name, labels={"envelope.test/e2e": "true"})
    return name


def oracle_cases(request: pytest.FixtureRequest, default: int, *, minimum: int = 20) -> int:
    """How many cases an oracle runs: ``--cases N``, else its CI ``default`` times
    ``--oracle-fraction`` (at least ``minimum``, never more than the default)."""
    value = request.config.getoption("--cases", default=None)
    if value:
        return int(value)
    fraction = float(request.config.getoption("--oracle-fraction", default=1.0) or 1.0)
    return default if fraction >= 1 else min(default, max(minimum, round(default * fraction)))


@pytest.fixture(scope="session")
def gitopsdiff() -> Path:
    """Argo CD's diff and sync code (e2e/gitopsdiff); built once per session."""
    return _or_fail(harness.gitopsdiff_binary)


@pytest.fixture(scope="session")
def kube_minor(cluster: Cluster) -> int:
    """The API server's minor version (37 for v1.37.2): the oracles' version-specific
    expectations (read from upstream at each tag) key on it."""
    status, body = cluster.get_raw("/version")
    assert status == 200, body
    return int(str(json.loads(body)["minor"]).rstrip("+"))


@pytest.fixture(scope="session")
def oracle_seed(request: pytest.FixtureRequest) -> int:
    """Seed of the oracles' generators (``--oracle-seed``); printed in every failure."""
    return int(request.config.getoption("--oracle-seed", default=12))


@pytest.fixture(scope="session")
def scheduler(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Scheduler]:
    """kube-scheduler (same Kubernetes version as kube-apiserver), profile
    ``envelope-oracle``, bound to the session cluster; stopped at session end."""
    if EXTERNAL_KUBECONFIG:
        pytest.skip("the scheduling oracle needs the harness's own kube-scheduler")
    workdir = tmp_path_factory.mktemp("scheduler")
    running = _or_fail(lambda: harness.start_scheduler(cluster, workdir))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def webhook(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """The Envelope webhook (``python -m app serve``) running on 127.0.0.1 and
    registered as Mutating/ValidatingWebhookConfiguration ``envelope-e2e``.
    Ready once the API server has had an HTTP 200 from both webhooks.

    Against an external cluster the chart-installed release is the webhook: None."""
    if EXTERNAL_KUBECONFIG:
        yield None  # type: ignore[misc]
        return
    workdir = tmp_path_factory.mktemp("webhook")
    # A short staleness bound, so a lost watch shows in readiness within seconds.
    running = _or_fail(lambda: harness.start_webhook(workdir, kubeconfig=cluster.kubeconfig,
                                                     extra_args=["--staleness", "5"]))
    try:
        _or_fail(lambda: harness.register_webhook(cluster, running))
        yield running
    finally:
        harness.unregister_webhook(cluster)
        running.stop()


# --- the convergence oracles' control plane (e2e/test_oracle_convergence.py, _podconstruction.py)

RUNTIME_CLASS = "envelope-conv-rc"


@dataclass
class Converging:
    cluster: Cluster
    controllers: harness.ControllerManager
    scheduler: harness.Scheduler
    webhook: Webhook


@pytest.fixture(scope="session")
def converging(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Converging]:
    """A control plane of its own for the convergence oracles: etcd, kube-apiserver,
    kube-controller-manager (harness.CONVERGENCE_CONTROLLERS), kube-scheduler (profile
    ``envelope-oracle``) and the Envelope webhook registered; three Nodes (plain, a
    tainted GPU node, a cordoned node) and the RuntimeClass RUNTIME_CLASS."""
    if EXTERNAL_KUBECONFIG:
        pytest.skip("the convergence oracles need a control plane of their own")
    work = tmp_path_factory.mktemp("converging")
    cluster = harness.start_control_plane(work / "cp", controlplane_bin_dir)
    procs: list[Any] = []
    try:
        harness.install_crds(cluster)
        kcm = harness.start_controller_manager(cluster, work / "kcm")
        procs.append(kcm)
        scheduler = harness.start_scheduler(cluster, work / "scheduler")
        procs.append(scheduler)
        webhook = harness.start_webhook(work / "webhook", kubeconfig=cluster.kubeconfig,
                                        extra_args=["--staleness", "5"])
        procs.append(webhook)
        harness.register_webhook(cluster, webhook)
        _nodes(cluster)
        yield Converging(cluster, kcm, scheduler, webhook)
    finally:
        for proc in reversed(procs):
            proc.stop()
        cluster.stop()


def _nodes(cluster: Cluster) -> None:
    """Three shapes: a plain node, a tainted GPU node, a cordoned node; and a RuntimeClass
    with overhead and scheduling (the RuntimeClass admission plugin copies both into the
    Pods that name it)."""
    cluster.create_node("conv-plain", {"cpu": "32", "memory": "128Gi", "pods": "500"},
                        labels={"envelope.test/pool": "plain"})
    cluster.create_node("conv-gpu", {"cpu": "64", "memory": "512Gi", "pods": "500", "nvidia.com/gpu": "8"},
                        labels={"envelope.test/pool": "gpu"},
                        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    cluster.create_node("conv-cordoned", {"cpu": "96", "memory": "768Gi", "pods": "500"},
                        labels={"envelope.test/pool": "plain"}, unschedulable=True)
    rc = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS},
          "handler": "runc", "overhead": {"podFixed": {"cpu": "250m", "memory": "128Mi"}},
          "scheduling": {"nodeSelector": {"envelope.test/pool": "plain"},
                         "tolerations": [{"key": "envelope.test/sandbox", "operator": "Exists"}]}}
    status, body = cluster.api("POST", "/apis/node.k8s.io/v1/runtimeclasses", rc)
    assert status in (201, 409), body


# --- the node (e2e/test_node_*.py): containerd and a real kubelet

#: kube-controller-manager's controllers on the node's control plane: the workloads', the
#: quota status its readiness probe waits for, and the node lifecycle controller (it marks
#: the Node NotReady and taints it when its kubelet stops).
NODE_CONTROLLERS = ("deployment-controller", "replicaset-controller", "garbage-collector-controller",
                    "resourcequota-controller", "node-lifecycle-controller")


@dataclass
class NodeEnv:
    cluster: Cluster
    node: harness.Node
    controllers: harness.ControllerManager
    scheduler: harness.Scheduler
    webhook: Webhook

    def namespace(self, prefix: str, *, webhook: bool = True) -> str:
        """A fresh namespace; ``webhook=False``: one the webhook does not judge (isolated)."""
        labels = {} if webhook else {harness.ISOLATED_NAMESPACE_LABEL: "true"}
        return self.cluster.create_namespace(harness.unique_name(prefix, max_length=40), labels=labels)


@pytest.fixture
def node_env(node_session: NodeEnv) -> Iterator[NodeEnv]:
    """The session's node (``node_session``), emptied after each test: every Pod bound to it
    deleted and containerd running no task, so a failed test leaves nothing running that
    the next one would count."""
    yield node_session
    node_session.node.delete_pods()


@pytest.fixture(scope="session")
def node_session(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeEnv]:
    """A control plane of its own (the kubelet would otherwise run the session cluster's
    pods and change what pod-fits-node sees there) with one real Node. Fails, never skips,
    when the machine lacks what the node needs: the message names the packages."""
    if EXTERNAL_KUBECONFIG:
        pytest.skip("the node tests start a kubelet of their own")
    work = tmp_path_factory.mktemp("node")
    problems = harness.node_prerequisites()
    if problems:
        pytest.fail("the e2e node cannot run here: " + "; ".join(problems), pytrace=False)
    kubelet_bin = _or_fail(harness.kubelet_binary)
    cluster = _or_fail(lambda: harness.start_control_plane(
        work / "cp", controlplane_bin_dir,
        apiserver_args=["--kubelet-preferred-address-types=InternalIP"]))
    procs: list[Any] = []
    node: harness.Node | None = None
    try:
        harness.install_crds(cluster)
        kcm = _or_fail(lambda: harness.start_controller_manager(cluster, work / "kcm", NODE_CONTROLLERS,
                                                                kubelets=True))
        procs.append(kcm)
        scheduler = _or_fail(lambda: harness.start_scheduler(cluster, work / "scheduler",
                                                             default_profile=True))
        procs.append(scheduler)
        webhook = _or_fail(lambda: harness.start_webhook(work / "webhook", kubeconfig=cluster.kubeconfig,
                                                         extra_args=["--staleness", "5"]))
        procs.append(webhook)
        _or_fail(lambda: harness.register_webhook(cluster, webhook))
        node = _or_fail(lambda: harness.start_node(cluster, work / "n",
                                                   kubelet_bin=kubelet_bin))
        _or_fail(lambda: node.wait_ready(untainted=True) if node else None)
        yield NodeEnv(cluster, node, kcm, scheduler, webhook)
    finally:
        left: list[str] = []
        if node is not None:
            node.stop()
            left = node.leftovers()
        for proc in reversed(procs):
            proc.stop()
        cluster.stop()
        if left:
            pytest.fail(f"the e2e node left behind: {left}", pytrace=False)
