from app.cluster.view import Index, StaticView

PARENT = Index("TestThing", "parent", lambda o: [o["spec"]["parent"]] if o["spec"]["parent"] else [])


def obj(kind: str, name: str, ns: str = "", parent: str = "") -> dict:
    return {"kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": {"parent": parent}}


def test_indexes_follow_adds_updates_and_removes() -> None:
    view = StaticView([obj("TestThing", "a", parent="p1"), obj("TestThing", "b", parent="p1"),
                       obj("TestThing", "c", parent="p2"), obj("TestThing", "d", ns="x")])
    assert sorted(o["metadata"]["name"] for o in view.by_index(PARENT, "p1")) == ["a", "b"]
    view.add(obj("TestThing", "a", parent="p2"))  # re-parented
    assert [o["metadata"]["name"] for o in view.by_index(PARENT, "p1")] == ["b"]
    assert len(view.by_index(PARENT, "p2")) == 2
    view.remove("TestThing", "c")
    assert [o["metadata"]["name"] for o in view.by_index(PARENT, "p2")] == ["a"]
    assert [o["metadata"]["name"] for o in view.list("TestThing", "x")] == ["d"]
    assert view.get("TestThing", "d", "x") is not None and view.get("TestThing", "d") is None
    view.replace("TestThing", [obj("TestThing", "z", parent="p1")])
    assert [o["metadata"]["name"] for o in view.list("TestThing")] == ["z"]
    assert view.list("TestThing", "x") == []
    assert [o["metadata"]["name"] for o in view.by_index(PARENT, "p1")] == ["z"]


def test_a_namespace_version_changes_only_with_that_namespace_or_a_relist() -> None:
    def dep(name: str, ns: str, replicas: int = 1) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns}, "spec": {"replicas": replicas}}

    view = StaticView([dep("a", "one"), dep("b", "two")])
    one, two = view.version("Deployment", "one"), view.version("Deployment", "two")
    assert 0 < one != two and view.version("Deployment", "three") == 0
    view.add(dep("a", "one", 2))
    assert view.version("Deployment", "one") > one and view.version("Deployment", "two") == two
    view.add(dep("a", "one", 2))  # no change: no new version
    changed = view.version("Deployment", "one")
    assert view.version("Deployment", "one") == changed
    view.remove("Deployment", "b", "two")
    assert view.version("Deployment", "two") > two
    before = {ns: view.version("Deployment", ns) for ns in ("one", "two", "three")}
    view.replace("Deployment", [dep("a", "one", 3)])  # a re-list: every namespace may have changed
    assert all(view.version("Deployment", ns) > v for ns, v in before.items())
    assert view.version("Deployment") == view.version("Deployment", "three")
    # another store's states never share a version with this one's
    other = StaticView([dep("a", "one")])
    assert other.version("Deployment", "one") not in {view.version("Deployment", "one"), one, changed}
