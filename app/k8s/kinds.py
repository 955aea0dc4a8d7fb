"""Every kind Envelope judges or reads, written once.

A :class:`Kind` says what the API server says of it — group, versions, resource (the
plural in URLs and RBAC) and subresources, namespaced or not, whether a CRD that may be
absent — and how Envelope reads it: its name in the cluster view and in rules'
``reads``, and how the live view trims it. The live view's watch list, the audit's and
``check --kubeconfig``'s listings, and the chart's webhook ``rules`` and RBAC
(``app/chart/kinds.py``) are derived from this table and the rule declarations.

Same-named kinds of different groups are told apart by ``(group, kind)`` (:func:`ref_of`
of an object), named one to one by :func:`name_of` (``NodePool`` is KAI's,
``NodePool.karpenter.sh`` the other, as kubectl names resources); :func:`ref` turns a
name back. Adding a kind is one entry here (plus the rules that judge or read it):
docs/architecture.md, "Adding a kind".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["KARPENTER_NODEPOOL", "KINDS", "Kind", "Ref", "Trim", "by_name", "by_ref", "name_of",
           "read_kinds", "ref", "ref_of"]

Ref = tuple[str, str]
"""(API group, kind): how the store and the rule set tell kinds apart."""

Trim = Literal["whole", "node", "workload", "karpenter-nodepool", "exception"]
"""How the live view trims an object it keeps (functions in ``cluster/live.py``):
``whole`` all but status and managedFields; ``node`` labels, taints, capacity;
``workload`` replicas and the pod template's resources; ``karpenter-nodepool`` what
``pod-fits-node`` reads of a Karpenter NodePool; ``exception`` what the engine reads of an
EnvelopeException, each part capped."""


@dataclass(frozen=True)
class Kind:
    group: str
    versions: tuple[str, ...]
    """Served versions Envelope knows; the first is the one listed and named in webhook
    rules (``matchPolicy: Equivalent`` sends the others converted to it)."""
    kind: str
    resource: str
    namespaced: bool
    trim: Trim | None = None
    """How the live view keeps it; None: never read, only judged."""
    optional: bool = False
    """A CRD that may not be installed: a 404 lists nothing (synced and empty)."""
    subresources: tuple[str, ...] = ()
    """Subresources whose writes the webhooks judge (``resource/sub`` in webhook rules)."""
    status: tuple[str, ...] = ()
    """``status`` fields the live view keeps (a ``whole`` trim drops status otherwise): a
    KAI Queue's usage, read by app/rules/quotas/usage.py."""
    alias: str = field(default="", compare=False)
    """The view name when the kind's name is taken by an earlier entry (set by the
    table: ``Kind.group``)."""

    @property
    def ref(self) -> Ref:
        return (self.group, self.kind)

    @property
    def name(self) -> str:
        """What rules and views call it (``reads``, ``view.list``)."""
        return self.alias or self.kind

    @property
    def version(self) -> str:
        return self.versions[0]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        """The cluster-wide collection: ``/api/v1/nodes``, ``/apis/apps/v1/deployments``."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/{self.resource}"

    @property
    def scope(self) -> Literal["Namespaced", "Cluster"]:
        return "Namespaced" if self.namespaced else "Cluster"


def _table(*kinds: Kind) -> tuple[Kind, ...]:
    seen: set[str] = set()
    out = []
    for k in kinds:
        if k.kind in seen:
            k = dataclasses.replace(k, alias=f"{k.kind}.{k.group}")
        seen.add(k.kind)
        out.append(k)
    return tuple(out)


KINDS: tuple[Kind, ...] = _table(
    Kind("", ("v1",), "Namespace", "namespaces", False, "whole"),
    Kind("", ("v1",), "Node", "nodes", False, "node"),
    Kind("", ("v1",), "LimitRange", "limitranges", True, "whole"),
    Kind("", ("v1",), "ResourceQuota", "resourcequotas", True, "whole"),
    # In-place resize (GA 1.35) changes a running Pod's resources only through pods/resize.
    Kind("", ("v1",), "Pod", "pods", True, subresources=("resize",)),
    Kind("", ("v1",), "ReplicationController", "replicationcontrollers", True, "workload"),
    Kind("apps", ("v1",), "Deployment", "deployments", True, "workload"),
    Kind("apps", ("v1",), "StatefulSet", "statefulsets", True, "workload"),
    Kind("apps", ("v1",), "ReplicaSet", "replicasets", True, "workload"),
    Kind("apps", ("v1",), "DaemonSet", "daemonsets", True),
    Kind("batch", ("v1",), "Job", "jobs", True, "workload"),
    Kind("batch", ("v1",), "CronJob", "cronjobs", True, "workload"),
    Kind("kai.resources", ("v1alpha1",), "NodePool", "nodepools", False, "whole", True),
    Kind("kai.resources", ("v1alpha1",), "Department", "departments", False, "whole", True),
    Kind("kai.resources", ("v1alpha1",), "Project", "projects", False, "whole", True),
    Kind("scheduling.run.ai", ("v2",), "Queue", "queues", False, "whole", True,
         status=("allocated", "allocatedNonPreemptible", "requested")),
    # Karpenter's NodePool: named NodePool.karpenter.sh (KAI's came first).
    Kind("karpenter.sh", ("v1",), "NodePool", "nodepools", False, "karpenter-nodepool", True),
    Kind("ate.dev", ("v1alpha1",), "WorkerPool", "workerpools", True, "whole", True),
    Kind("ate.dev", ("v1alpha1",), "ActorTemplate", "actortemplates", True, "whole", True),
    # Which runtime handler (and pod overhead, node scheduling) a pod's runtimeClassName
    # selects: read by the convergence work; built in since 1.20, so not optional.
    Kind("node.k8s.io", ("v1",), "RuntimeClass", "runtimeclasses", False, "whole"),
    # The Priority admission plugin gives a Pod that names no class the globalDefault
    # one, and quota scopes PriorityClass match it (app/k8s/podmodel.py ``admit``).
    Kind("scheduling.k8s.io", ("v1",), "PriorityClass", "priorityclasses", False, "whole"),
    # Dynamic resource allocation (resource.k8s.io/v1, GA since 1.34): the devices
    # pod-fits-node counts (app/k8s/dra.py). Served only from 1.34 on: optional (a 404 lists
    # nothing). A claim's allocation is in its status (the devices it holds).
    Kind("resource.k8s.io", ("v1",), "DeviceClass", "deviceclasses", False, "whole", True),
    Kind("resource.k8s.io", ("v1",), "ResourceSlice", "resourceslices", False, "whole", True),
    Kind("resource.k8s.io", ("v1",), "ResourceClaim", "resourceclaims", True, "whole", True,
         status=("allocation",)),
    Kind("resource.k8s.io", ("v1",), "ResourceClaimTemplate", "resourceclaimtemplates", True,
         "whole", True),
    # Envelope's own exception resource (charts/envelope/templates/exceptions.yaml): judged
    # by exception-allowed, read by the engine when the policy delegates exceptions.
    Kind("envelope.io", ("v1alpha1",), "EnvelopeException", "envelopeexceptions", True,
         "exception", True),
)

_BY_REF: dict[Ref, Kind] = {k.ref: k for k in KINDS}
_BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
_REF_OF_NAME: dict[str, Ref] = {k.name: k.ref for k in KINDS}

KARPENTER_NODEPOOL = _BY_REF[("karpenter.sh", "NodePool")].name


def by_ref(group: str, kind: str) -> Kind | None:
    return _BY_REF.get((group, kind))


def by_name(name: str) -> Kind | None:
    return _BY_NAME.get(name)


def ref(name: str) -> Ref:
    """(group, kind) of a view name: a registered name, ``Kind.group``, or (for a kind
    Envelope does not know, e.g. in tests) the core group."""
    found = _REF_OF_NAME.get(name)
    if found is not None:
        return found
    kind, dot, group = name.partition(".")
    return (group, kind) if dot else ("", name)


def ref_of(obj: dict[str, Any]) -> Ref:
    """(group, kind) of an object, by its apiVersion; an object without one (a
    hand-written fixture) is taken to be the registered kind of its name."""
    kind = obj.get("kind")
    kind = kind if isinstance(kind, str) else str(kind)
    api = obj.get("apiVersion")
    if not isinstance(api, str) or not api:
        return ref(kind)
    return (api.rpartition("/")[0], kind)


def name_of(group: str, kind: str) -> str:
    """The view name of (group, kind): the registered name, else ``Kind.group``."""
    found = _BY_REF.get((group, kind))
    if found is not None:
        return found.name
    return f"{kind}.{group}" if group else kind


def read_kinds(names: Iterable[str]) -> tuple[Kind, ...]:
    """The registered kinds of ``names`` (rules' ``reads``), in table order; a name with
    no entry, or one the live view cannot keep (no ``trim``), is a programming error."""
    wanted = set(names)
    missing = sorted(n for n in wanted if n not in _BY_NAME or _BY_NAME[n].trim is None)
    if missing:
        raise ValueError(f"no watch is defined for kind(s) {missing}; add them (with a trim) "
                         f"to KINDS in app/k8s/kinds.py")
    return tuple(k for k in KINDS if k.name in wanted)
