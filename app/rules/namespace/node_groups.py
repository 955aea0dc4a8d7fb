"""The nodes ``pod-fits-node`` judges, grouped: the class index (``NODE_CLASS``: nodes alike
for every pod), one stand-in per class with the policy's reserves taken off, the nodes a
pod names on their own, and classes split by their members' DRA devices once per change.

A review judges one node per class, so its cost follows the number of node shapes, not
of nodes (docs/architecture.md "nodes judged by class", docs/benchmarks.md). The filters
themselves are ``app/k8s/scheduling.py``; the rule is ``pod_fits.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import orjson

from app.cluster.view import NODE_LABEL, ClusterView, Index
from app.k8s.dra import DeviceState, allocated_devices, node_device_states
from app.k8s.namespace_policy import name_of
from app.k8s.quantity import QuantityError
from app.k8s.scheduling import Node as SchedNode
from app.k8s.scheduling import (
    NodeGroup,
    class_key,
    class_node,
    mentions,
    node_from_object,
    node_selector_matches,
)
from app.k8s.util import Memo, digest


def _node_of(node: dict[str, Any]) -> SchedNode | None:
    """A Node as app.k8s.scheduling sees it (None when a quantity of it does not parse: such a
    node is not judged). The view holds no Pods, so nodes are judged empty; a node that
    reports no ``pods`` allocatable is not limited by pod count."""
    status = node.get("status") or {}
    merged = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    merged.setdefault("pods", "1000000")
    try:
        return node_from_object({**node, "status": {"allocatable": merged}})
    except QuantityError:
        return None


def node_class(node: dict[str, Any]) -> list[str]:
    built = _node_of(node)
    return [] if built is None else [class_key(built)]


#: Nodes by class (app.k8s.scheduling ``class_key``: everything the filters read but the
#: name and per-node labels), kept current by the view on every watch event: a review
#: judges one node per class, so its cost follows the number of node shapes.
NODE_CLASS = Index("Node", "class", node_class)


MAX_NODE_GROUPS = 500
"""The most node classes (plus nodes the pod names) one review judges: when none of
them takes the pod and more remain, ``pod-fits-node`` allows it with a warning that it
did not decide — never a refusal it has not checked (docs/deploy.md, "Capacity").
~13 us each on the benchmark machine: ~6 ms CPU for a review that reaches the cap
(docs/benchmarks.md, "pod-fits-node by node class")."""

_classes: Memo[tuple[str, int, int], SchedNode] = Memo(4 * MAX_NODE_GROUPS, 8 * 2**20)


def _reserved(node: SchedNode, reserve_cpu: int, reserve_memory: int) -> SchedNode:
    alloc = dict(node.allocatable)
    alloc["cpu"] = alloc.get("cpu", 0) - reserve_cpu
    alloc["memory"] = alloc.get("memory", 0) - reserve_memory
    return replace(node, allocatable=alloc)


def class_stand_in(key: str, reserve_cpu: int, reserve_memory: int) -> SchedNode:
    """The stand-in of a class, the policy's reserves taken off (decoded once per class)."""
    memo_key = (key, reserve_cpu, reserve_memory)
    found = _classes.get(memo_key)
    if found is None:
        found = _classes.put(memo_key, _reserved(class_node(key), reserve_cpu, reserve_memory))
    return found


def as_member(stand_in: SchedNode, obj: dict[str, Any]) -> SchedNode:
    """A member of a class as itself: the class's node with the member's name and labels."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return replace(stand_in, name="", labels={})  # as node_from_object reads such a node
    labels = meta.get("labels")
    return replace(stand_in, name=str(meta.get("name", "")),
                   labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {})


DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
"""resource.k8s.io/v1 kinds ``pod-fits-node`` reads (app/k8s/dra.py)."""


def _slice_read(obj: dict[str, Any]) -> list[str]:
    """All ``node_device_states`` reads of a ResourceSlice is its spec."""
    try:
        return [digest(obj.get("spec")).hex()]
    except TypeError:
        return [repr(obj.get("spec"))]


def _claim_devices(obj: dict[str, Any]) -> list[str]:
    """The devices a ResourceClaim's allocation takes: all ``node_device_states`` reads
    of a claim (``status.allocation.devices.results``)."""
    return [orjson.dumps(taken).decode() for taken in sorted(allocated_devices([obj]))]


SLICE_SPEC = Index("ResourceSlice", "spec", _slice_read)
CLAIM_DEVICES = Index("ResourceClaim", "allocated devices", _claim_devices)
"""What the device split reads of slices and claims: their index versions move when
that changes, not on a claim's labels or a slice's annotations."""

Split = dict[str, list[tuple[DeviceState | None, list[str]]]]
_splits: Memo[tuple[int, int, int, int, frozenset[str]], tuple[dict[str, DeviceState], Split]] = Memo(
    16, 32 * 2**20)


def _device_split(view: ClusterView, keys: frozenset[str]) -> tuple[dict[str, DeviceState], Split]:
    """Each node's DRA devices (projected on the attributes ``keys`` the pod's selectors
    read) and each node class split by them: computed again only when what it reads
    changes — a node's class or labels, a node added or removed, a ResourceSlice's spec,
    the devices claims hold (``view.index_version``) — not on a Node's status report or
    a claim's labels (issue 38: a resplit per Node write took GPU reviews to p99 588 ms)."""
    memo_key = (view.index_version(NODE_CLASS), view.index_version(NODE_LABEL),
                view.index_version(SLICE_SPEC), view.index_version(CLAIM_DEVICES), keys)
    found = _splits.get(memo_key)
    if found is not None:
        return found
    members: list[tuple[str, str, dict[str, Any]]] = []
    for key in view.index_counts(NODE_CLASS):
        for obj in view.by_index(NODE_CLASS, key):
            members.append((key, name_of(obj), obj))

    def matcher(key: str, obj: dict[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
        """Built only for a slice that selects nodes (most name theirs)."""
        return lambda selector: node_selector_matches(selector, as_member(class_node(key), obj))

    states = node_device_states(view.list("ResourceSlice"), view.list("ResourceClaim"),
                                ((name, matcher(key, obj)) for key, name, obj in members), keys)
    by: dict[str, dict[DeviceState | None, list[str]]] = {}
    for key, name, _ in members:
        by.setdefault(key, {}).setdefault(states.get(name), []).append(name)
    split: Split = {key: list(groups.items()) for key, groups in by.items()}
    return _splits.put(memo_key, (states, split))


def node_groups(view: ClusterView, spec: dict[str, Any], reserve_cpu: int,
            reserve_memory: int, keys: frozenset[str] | None = None) -> Iterator[NodeGroup]:
    """The nodes to judge, built as ``place_pod`` asks for them: each node the pod mentions
    (a name in ``matchFields``, a per-node label value) on its own, then one stand-in per
    class for the rest (app.k8s.scheduling ``place_pod``). ``keys``: the pod asks for DRA
    devices (the attributes its selectors read): classes are split by their members'
    devices, and each node carries its own."""
    counts = view.index_counts(NODE_CLASS)
    states, split = _device_split(view, keys) if keys is not None else ({}, {})
    said = mentions(spec)
    if said.per_node:  # judge every node on its own
        for key in counts:
            stand_in = class_stand_in(key, reserve_cpu, reserve_memory)
            for obj in view.by_index(NODE_CLASS, key):
                node = as_member(stand_in, obj)
                yield NodeGroup(replace(node, devices=states.get(node.name)) if keys is not None else node)
        return
    named: dict[str, dict[str, Any]] = {}
    for name in sorted(said.names):
        found = view.get("Node", name)
        if found is not None:
            named[name] = found
    for key, value in sorted(said.labels):
        for found in view.by_index(NODE_LABEL, f"{key}={value}"):
            named[name_of(found)] = found
    taken: dict[str, int] = {}
    own: list[NodeGroup] = []
    for obj in named.values():
        if len(own) > MAX_NODE_GROUPS:
            break  # place_pod stops before the classes: what they hold no longer matters
        node_key = next(iter(node_class(obj)), None)
        if node_key is None or node_key not in counts:
            continue  # not a node the rule judges (a quantity does not parse), or just added
        taken[node_key] = taken.get(node_key, 0) + 1
        node = as_member(class_stand_in(node_key, reserve_cpu, reserve_memory), obj)
        own.append(NodeGroup(replace(node, devices=states.get(node.name)) if keys is not None else node))
    yield from own
    for key, count in counts.items():
        if keys is not None:
            stand_in = class_stand_in(key, reserve_cpu, reserve_memory)
            for state, names_of in split.get(key, ()):
                rest_names = [n for n in names_of if n not in named] if named else names_of
                if rest_names:
                    yield NodeGroup(replace(stand_in, devices=state), len(rest_names),
                                    partial(list, rest_names))
            continue
        rest = count - taken.get(key, 0)
        if rest <= 0:
            continue

        def names(key: str = key) -> list[str]:
            found = view.index_names(NODE_CLASS, key)
            return [n for n in found if n not in named] if named else found

        yield NodeGroup(class_stand_in(key, reserve_cpu, reserve_memory), rest, names)
