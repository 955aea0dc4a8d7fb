"""Store.replace: the whole set of a kind swapped at once, indexes included."""

from __future__ import annotations

import threading
from typing import Any

from app.cluster.live import trim_node
from app.cluster.view import NODE_LABEL, Store


def node(i: int, zone: str) -> dict[str, Any]:
    return trim_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": f"n{i}", "labels": {"zone": zone},
                                   "resourceVersion": str(i)}})


def test_replace_swaps_objects_and_indexes() -> None:
    store = Store()
    store.replace("Node", [node(i, "a") for i in range(10)])
    v1 = store.version("Node")
    assert store.count("Node") == 10
    assert len(store.by_index(NODE_LABEL, "zone=a")) == 10
    store.replace("Node", [node(i, "b") for i in range(3)])
    assert store.version("Node") > v1
    assert store.count("Node") == 3
    assert store.by_index(NODE_LABEL, "zone=a") == []
    assert len(store.by_index(NODE_LABEL, "zone=b")) == 3
    store.add(node(7, "a"), "Node")
    store.remove("Node", "n0")
    assert {n["metadata"]["name"] for n in store.list("Node")} == {"n1", "n2", "n7"}
    assert [n["metadata"]["name"] for n in store.by_index(NODE_LABEL, "zone=a")] == ["n7"]


def test_readers_never_see_a_partial_set() -> None:
    """A re-list that empties the kind and adds one by one (as Store.replace once did)
    shows readers partial sets; Store.replace never shows anything but a complete set."""
    sets = [[node(i, "a") for i in range(2000)], [node(i, "b") for i in range(2000)]]

    def partial_sizes(store: Store) -> set[int]:
        store.replace("Node", sets[0])
        seen: set[int] = set()
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                seen.add(len(store.list("Node")))

        thread = threading.Thread(target=reader)
        thread.start()
        for i in range(20):
            store.replace("Node", sets[i % 2])
        stop.set()
        thread.join()
        return seen - {2000}

    class OneByOne(Store):
        def replace(self, kind: str, objects: Any) -> None:
            for obj in self.list(kind):
                self.remove(kind, obj["metadata"]["name"])
            for obj in objects:
                self.add(obj, kind)

    assert partial_sizes(Store()) == set()
    assert partial_sizes(OneByOne()), "the reader never overlapped a one-by-one re-list"


def test_shared_parts_are_equal_and_stored_once() -> None:
    import copy

    import orjson

    from app.cluster.live import Shared, trim_workload

    def deployment(name: str, memory: str) -> dict[str, Any]:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "team-a", "resourceVersion": "1",
                             "managedFields": [{"manager": "kubectl"}]},
                "spec": {"replicas": 2, "template": {"spec": {"containers": [
                    {"name": "app", "image": "x", "resources": {"limits": {"memory": memory},
                                                                "requests": {"memory": memory}}}],
                    "nodeSelector": {"pool": "gpu"}}}}}

    trim = trim_workload("Deployment")
    a = trim(orjson.loads(orjson.dumps(deployment("a", "1Gi"))))
    b = trim(orjson.loads(orjson.dumps(deployment("b", "1Gi"))))
    c = trim(orjson.loads(orjson.dumps(deployment("c", "2Gi"))))
    assert a is not None and b is not None and c is not None
    assert a["spec"]["template"] is b["spec"]["template"]
    assert c["spec"]["template"] is not a["spec"]["template"]
    assert c["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "2Gi"}
    assert a["spec"]["template"]["spec"]["nodeSelector"] is c["spec"]["template"]["spec"][
        "nodeSelector"]
    assert a["metadata"] == {"name": "a", "namespace": "team-a", "resourceVersion": "1"}

    share = Shared(limit=2)
    value = {"limits": {"memory": "1Gi"}}
    first = share(copy.deepcopy(value))
    assert share(copy.deepcopy(value)) is first
    # A hash hit with a different value (a collision) is not shared.
    key = hash(orjson.dumps({"x": 1}, option=orjson.OPT_SORT_KEYS))
    share._cache[key] = {"y": 2}
    assert share({"x": 1}) == {"x": 1}
    for i in range(5):  # the bound: the cache starts over instead of growing
        share({"n": i})
    assert len(share._cache) <= 2
