"""A real Kubernetes control plane (etcd + kube-apiserver) for end-to-end tests.

This is what controller-runtime's envtest does, in Python: the binaries are
built from the upstream Go modules by ``e2e/controlplane/build.sh`` (cached
outside the clone), certificates are made with ``cryptography``, and the
processes run on free ports on 127.0.0.1. kube-scheduler is started on
demand (``start_scheduler``) with one profile, ``envelope-oracle``, and binds
only Pods that name it to Node objects the tests create (no kubelet, as KWOK).
On the session's shared API server no controllers run: Deployments create no Pods,
namespaces never finish deleting, nothing is garbage collected. The convergence
oracles start a control plane of their own with kube-controller-manager
(``start_controller_manager``, the workload controllers, the garbage collector, quota
status, ResourceClaims; never the node lifecycle controller, which would evict pods
from Nodes that have no kubelet).

The pytest fixtures live in ``e2e/conftest.py``; everything here is plain
functions and classes so it can be reused outside pytest, e.g.::

    bin_dir = locate_bin_dir()
    with start_control_plane(Path("/tmp/cp"), bin_dir) as cluster:
        cluster.kubectl("get", "namespaces")

The package has one module per part, in the order they build on each other: ``base``
(paths, names, errors), ``ports``, ``certificates``, ``processes``, ``binaries``,
``cluster`` (etcd + kube-apiserver), ``scheduler`` (kube-scheduler), ``controllers``
(kube-controller-manager), ``webhook`` and ``node`` (containerd and a real kubelet).
Everything is re-exported here, so ``import harness`` and ``from harness import
Cluster`` are all a test needs.
"""

from __future__ import annotations

from .base import (
    BIN_ENV as BIN_ENV,
)
from .base import (
    BINARIES as BINARIES,
)
from .base import (
    BUILD_SCRIPT as BUILD_SCRIPT,
)
from .base import (
    ISOLATED_NAMESPACE_LABEL as ISOLATED_NAMESPACE_LABEL,
)
from .base import (
    MUTATING_WEBHOOK_NAME as MUTATING_WEBHOOK_NAME,
)
from .base import (
    PROBE_NAMESPACE as PROBE_NAMESPACE,
)
from .base import (
    READY_TIMEOUT as READY_TIMEOUT,
)
from .base import (
    REPO_ROOT as REPO_ROOT,
)
from .base import (
    VALIDATING_WEBHOOK_NAME as VALIDATING_WEBHOOK_NAME,
)
from .base import (
    WEBHOOK_CONFIGURATION_NAME as WEBHOOK_CONFIGURATION_NAME,
)
from .base import (
    CommandError as CommandError,
)
from .base import (
    HarnessError as HarnessError,
)
from .base import (
    unique_name as unique_name,
)
from .base import (
    warning_texts as warning_texts,
)
from .binaries import (
    GITOPSDIFF_MODES as GITOPSDIFF_MODES,
)
from .binaries import (
    _binaries_missing as _binaries_missing,
)
from .binaries import (
    gitopsdiff_binary as gitopsdiff_binary,
)
from .binaries import (
    locate_bin_dir as locate_bin_dir,
)
from .certificates import (
    CertificateAuthority as CertificateAuthority,
)
from .certificates import (
    ControlPlanePKI as ControlPlanePKI,
)
from .certificates import (
    _cert_pem as _cert_pem,
)
from .certificates import (
    _key_pem as _key_pem,
)
from .certificates import (
    _key_usage as _key_usage,
)
from .certificates import (
    _now as _now,
)
from .certificates import (
    _write as _write,
)
from .certificates import (
    make_control_plane_pki as make_control_plane_pki,
)
from .certificates import (
    make_serving_cert as make_serving_cert,
)
from .certificates import (
    write_cert_and_key as write_cert_and_key,
)
from .cluster import (
    Cluster as Cluster,
)
from .cluster import (
    _https_get as _https_get,
)
from .cluster import (
    _kubeconfig_yaml as _kubeconfig_yaml,
)
from .cluster import (
    _PortConflict as _PortConflict,
)
from .cluster import (
    _start_apiserver as _start_apiserver,
)
from .cluster import (
    _start_etcd as _start_etcd,
)
from .cluster import (
    _tls_context as _tls_context,
)
from .cluster import (
    _wait_started as _wait_started,
)
from .cluster import (
    external_cluster as external_cluster,
)
from .cluster import (
    https_get as https_get,
)
from .cluster import (
    node_manifest as node_manifest,
)
from .cluster import (
    start_control_plane as start_control_plane,
)
from .cluster import (
    tls_context as tls_context,
)
from .cluster import (
    wait_until as wait_until,
)
from .controllers import (
    CONVERGENCE_CONTROLLERS as CONVERGENCE_CONTROLLERS,
)
from .controllers import (
    ControllerManager as ControllerManager,
)
from .controllers import (
    start_controller_manager as start_controller_manager,
)
from .node import (
    Node as Node,
)
from .node import (
    kubelet_binary as kubelet_binary,
)
from .node import (
    node_prerequisites as node_prerequisites,
)
from .node import (
    running_node as running_node,
)
from .node import (
    start_node as start_node,
)
from .ports import (
    free_port as free_port,
)
from .processes import (
    _HANDLERS_INSTALLED as _HANDLERS_INSTALLED,
)
from .processes import (
    _LIBC as _LIBC,
)
from .processes import (
    _LIVE as _LIVE,
)
from .processes import (
    _LIVE_LOCK as _LIVE_LOCK,
)
from .processes import (
    _PR_SET_PDEATHSIG as _PR_SET_PDEATHSIG,
)
from .processes import (
    _PREVIOUS_HANDLERS as _PREVIOUS_HANDLERS,
)
from .processes import (
    ManagedProcess as ManagedProcess,
)
from .processes import (
    _install_cleanup_handlers as _install_cleanup_handlers,
)
from .processes import (
    _on_signal as _on_signal,
)
from .processes import (
    _set_parent_death_signal as _set_parent_death_signal,
)
from .processes import (
    _signal_group as _signal_group,
)
from .processes import (
    start_process as start_process,
)
from .processes import (
    stop_all_processes as stop_all_processes,
)
from .processes import (
    stop_process as stop_process,
)
from .scheduler import (
    SCHEDULER_NAME as SCHEDULER_NAME,
)
from .scheduler import (
    Scheduler as Scheduler,
)
from .scheduler import (
    pod_schedule_outcome as pod_schedule_outcome,
)
from .scheduler import (
    start_scheduler as start_scheduler,
)
from .webhook import (
    CHART_DIR as CHART_DIR,
)
from .webhook import (
    CRD_DIR as CRD_DIR,
)
from .webhook import (
    RELEASE_NAMESPACE as RELEASE_NAMESPACE,
)
from .webhook import (
    Webhook as Webhook,
)
from .webhook import (
    _webhook_requests_answered as _webhook_requests_answered,
)
from .webhook import (
    install_crds as install_crds,
)
from .webhook import (
    probe_pod as probe_pod,
)
from .webhook import (
    register_webhook as register_webhook,
)
from .webhook import (
    start_webhook as start_webhook,
)
from .webhook import (
    unregister_webhook as unregister_webhook,
)
from .webhook import (
    webhook_configurations as webhook_configurations,
)
