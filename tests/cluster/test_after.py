"""app/cluster/after.py: the cluster as one write leaves it, for every read a rule makes."""

from __future__ import annotations

from typing import Any

from app.cluster.after import AfterWrite
from app.cluster.view import Index, StaticView

BY_TEAM = Index("Thing", "team", lambda o: [o["spec"]["team"]])


def thing(name: str, team: str, namespace: str = "a", api: str = "v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "Thing", "metadata": {"name": name, "namespace": namespace},
            "spec": {"team": team}}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{o['metadata']['namespace']}/{o['metadata']['name']}:{o['spec']['team']}" for o in objs)


VIEW = StaticView([thing("x", "red"), thing("y", "red"), thing("x", "red", namespace="b")], [BY_TEAM])


def test_an_update_replaces_the_cached_copy_in_every_read() -> None:
    moved = thing("x", "blue")
    after = AfterWrite(VIEW, "Thing", "x", moved, namespace="a")
    assert after.get("Thing", "x", "a") is moved
    assert after.get("Thing", "x", "b") == thing("x", "red", namespace="b")  # same name, other namespace
    assert names(after.list("Thing", "a")) == ["a/x:blue", "a/y:red"]
    assert names(after.list("Thing", "b")) == ["b/x:red"]
    assert names(after.list("Thing")) == ["a/x:blue", "a/y:red", "b/x:red"]
    assert names(after.by_index(BY_TEAM, "red")) == ["a/y:red", "b/x:red"]
    assert names(after.by_index(BY_TEAM, "blue")) == ["a/x:blue"]
    assert after.writes("Thing", "x", "a") and not after.writes("Thing", "x", "b")
    assert not after.writes("Other", "x", "a")


def test_a_delete_leaves_the_object_out_and_a_create_adds_it() -> None:
    gone = AfterWrite(VIEW, "Thing", "y", None, namespace="a")
    assert gone.get("Thing", "y", "a") is None
    assert names(gone.list("Thing", "a")) == ["a/x:red"]
    assert names(gone.by_index(BY_TEAM, "red")) == ["a/x:red", "b/x:red"]
    new = thing("z", "red")
    created = AfterWrite(VIEW, "Thing", "z", new, namespace="a")
    assert names(created.by_index(BY_TEAM, "red")) == ["a/x:red", "a/y:red", "a/z:red", "b/x:red"]
    assert names(created.list("Thing", "b")) == ["b/x:red"]  # not in the namespace read


def test_cluster_scoped_kinds_and_kept_groups() -> None:
    """KAI's kinds (rules/quotas): cluster-scoped, and a same-named kind of another API
    group is not returned by get or list."""
    view = StaticView([thing("q", "red", namespace=""), thing("v", "red", namespace="", api="other.io/v1")],
                      [BY_TEAM])
    ours = AfterWrite(view, "Thing", "q", thing("q", "blue", namespace="files-give-it-one"),
                      namespaced=False, keep=lambda kind, o: o["apiVersion"] == "v1")
    written = ours.get("Thing", "q")
    assert written is not None and written["spec"]["team"] == "blue"
    assert ours.get("Thing", "v") is None
    assert names(ours.list("Thing")) == ["files-give-it-one/q:blue"]
    # The store files a same-named kind of another group under its own name
    # (app.k8s.kinds.name_of: Thing.other.io), so the index of Thing never holds it.
    assert names(ours.by_index(BY_TEAM, "red")) == []
    assert names(ours.by_index(BY_TEAM, "blue")) == ["files-give-it-one/q:blue"]
