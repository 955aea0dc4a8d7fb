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
