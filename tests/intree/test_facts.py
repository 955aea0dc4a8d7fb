"""The namespace fact keepers (app/intree/facts.py): what the fact is, the one label a
write touches, the watch-driven keeper ``serve --in-tree-facts`` runs (rounds on view
changes, leadership, incomplete views, retries, metrics) and the LIST-based one."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from app.cluster.kube import ApiError
from app.cluster.view import Store
from app.intree import FACT_LABEL, FACT_VALUE
from app.intree.facts import (
    FIELD_MANAGER,
    FactKeeper,
    FactLease,
    FactMetrics,
    Leadership,
    ViewFactKeeper,
    fact_changes,
    label_patch,
    parse_selector,
)
from app.k8s.selectors import LabelSelector

PATCH = f"?fieldManager={FIELD_MANAGER}"


def _ns(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _quota(namespace: str, kind: str = "ResourceQuota") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "q", "namespace": namespace}}


# -- the fact -----------------------------------------------------------------------------

def test_fact_changes_label_exactly_the_namespaces_without_guarded_objects() -> None:
    namespaces = [_ns("empty"), _ns("quota", **{FACT_LABEL: FACT_VALUE}), _ns("limits"),
                  _ns("done", **{FACT_LABEL: FACT_VALUE}), _ns("stale", **{FACT_LABEL: "other"}),
                  {"metadata": {"name": "going", "deletionTimestamp": "2026-01-01T00:00:00Z"}}]
    guarded = [_quota("quota"), _quota("limits", "LimitRange")]
    assert fact_changes(namespaces, guarded) == {"empty": FACT_VALUE, "quota": None,
                                                 "stale": FACT_VALUE}
    only = LabelSelector.model_validate({"matchLabels": {"team": "a"}})
    assert fact_changes([_ns("x"), _ns("y", team="a")], [], only) == {"y": FACT_VALUE}


def test_selectors_are_key_value_pairs() -> None:
    selector = parse_selector("team=a, tier=web")
    assert selector is not None and selector.matches({"team": "a", "tier": "web", "x": "y"})
    assert not selector.matches({"team": "a"})
    assert parse_selector("") is None and parse_selector(" , ") is None
    for bad in ("team", "team!=a", "a=b=c", "=a"):
        with pytest.raises(ValueError):
            parse_selector(bad)


# -- the write touches the fact label only ---------------------------------------------------

def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


_keys = st.sampled_from(["team", "app.kubernetes.io/name", FACT_LABEL, "argocd.argoproj.io/instance",
                         "kubernetes.io/metadata.name", "in-tree.envelope.io/other"])
_values = st.sampled_from(["a", "", FACT_VALUE, "clear ", "x" * 63])
_maps = st.dictionaries(_keys, _values, max_size=6)


@given(labels=st.none() | _maps, annotations=st.none() | _maps,
       value=st.sampled_from([FACT_VALUE, None]))
def test_a_label_write_changes_the_fact_label_and_nothing_else(
        labels: dict[str, str] | None, annotations: dict[str, str] | None, value: str | None) -> None:
    meta: dict[str, Any] = {"name": "n", "resourceVersion": "7", "uid": "u"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
                 "spec": {"finalizers": ["kubernetes"]}}
    before = copy.deepcopy(namespace)
    after = _merge(namespace, label_patch(value))
    assert namespace == before  # the patch is data, not a mutation
    got = dict(after["metadata"].get("labels") or {})
    assert got.pop(FACT_LABEL, None) == value
    assert got == {k: v for k, v in (labels or {}).items() if k != FACT_LABEL}
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert {k: v for k, v in after["metadata"].items() if k != "labels"} == \
        {k: v for k, v in before["metadata"].items() if k != "labels"}
    assert after["spec"] == before["spec"]


# -- the watch-driven keeper -----------------------------------------------------------------

class _Client:
    """A KubeClient stand-in: LIST answers by path, PATCHes recorded (and applied to
    ``view``, as its watch would, when ``echo``)."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]] | None = None,
                 view: Store | None = None, echo: bool = False) -> None:
        self.lists = lists or {}
        self.view = view
        self.echo = echo
        self.patches: list[tuple[str, object]] = []
        self.fail: ApiError | Exception | None = None

    def get(self, path: str, fields: dict[str, object], timeout: float) -> object:
        class Page:
            data = json.dumps({"items": self.lists.get(path, []), "metadata": {}}).encode()
        return Page()

    def request(self, method: str, path: str, body: Any = None, **kw: object) -> dict[str, object]:
        assert method == "PATCH" and kw.get("content_type") == "application/merge-patch+json"
        if self.fail is not None:
            raise self.fail
        self.patches.append((path, body))
        if self.echo and self.view is not None:
            name = path.split("/")[4].split("?")[0]
            found = self.view.get("Namespace", name)
            assert found is not None
            self.view.add(_merge(found, body), "Namespace")
        return {}


class _View(Store):
    def __init__(self, objects: Iterable[dict[str, Any]] = ()) -> None:
        super().__init__()
        for obj in objects:
            self.add(obj, obj["kind"])
        self.missing: list[str] = []

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        return list(self.missing)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _keeper(view: _View, client: _Client, leading: list[bool] | None = None,
            **kw: Any) -> tuple[ViewFactKeeper, _Clock, FactMetrics, CollectorRegistry]:
    clock = _Clock()
    registry = CollectorRegistry()
    metrics = FactMetrics(registry)
    lead = leading if leading is not None else [True]
    keeper = ViewFactKeeper(client, view, lambda: lead[0], metrics, monotonic=clock, **kw)  # type: ignore[arg-type]
    return keeper, clock, metrics, registry


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_view_keeper_writes_on_a_change_and_only_then() -> None:
    view = _View([_ns("a"), _ns("b", **{FACT_LABEL: FACT_VALUE}), _quota("b")])
    client = _Client(view=view, echo=True)
    keeper, clock, _, registry = _keeper(view, client)
    assert keeper.step() == {"b": None, "a": FACT_VALUE}
    # removals first, each with the field manager
    assert client.patches == [(f"/api/v1/namespaces/b{PATCH}", label_patch(None)),
                              (f"/api/v1/namespaces/a{PATCH}", label_patch(FACT_VALUE))]
    assert keeper.step() == {}  # its own writes came back through the view: a round, no write
    assert keeper.step() is None  # nothing changed: no round at all
    # A LimitRange removed: the namespace gets the label back.
    view.add(_quota("c", "LimitRange"), "LimitRange")
    view.add(_ns("c"), "Namespace")
    assert keeper.step() == {}
    view.remove("LimitRange", "q", "c")
    assert keeper.step() == {"c": FACT_VALUE}
    # The label removed by hand on a clear namespace: restored.
    view.add(_ns("a", team="x"), "Namespace")
    assert keeper.step() == {"a": FACT_VALUE}
    assert view.get("Namespace", "a") == _ns("a", team="x", **{FACT_LABEL: FACT_VALUE})
    # A namespace created: labelled.
    view.add(_ns("new"), "Namespace")
    assert keeper.step() == {"new": FACT_VALUE}
    assert _sample(registry, "envelope_intree_fact_namespaces_labelled") == 3.0
    assert _sample(registry, "envelope_intree_fact_writes_total", change="added") == 4.0
    assert _sample(registry, "envelope_intree_fact_writes_total", change="removed") == 1.0
    assert (_sample(registry, "envelope_intree_fact_last_success_timestamp_seconds") or 0) > 0
    clock.now += 31
    assert keeper.step() == {}  # the resync: a round without a change


def test_a_write_the_view_has_not_reflected_is_not_repeated_until_it_settles() -> None:
    view = _View([_ns("a")])
    client = _Client(view=view)  # no echo: the watch event is slow
    keeper, clock, _, _ = _keeper(view, client)
    assert keeper.step() == {"a": FACT_VALUE}
    view.add(_ns("b", **{FACT_LABEL: FACT_VALUE}), "Namespace")  # another change: a round
    assert keeper.step() == {}
    clock.now += 5
    view.add(_ns("c", **{FACT_LABEL: FACT_VALUE}), "Namespace")
    assert keeper.step() == {"a": FACT_VALUE}  # still not reflected after 5 s: written again
    assert len(client.patches) == 2


def test_an_incomplete_view_only_removes() -> None:
    view = _View([_ns("a"), _ns("b", **{FACT_LABEL: FACT_VALUE}), _quota("b")])
    view.missing = ["ResourceQuota not synced"]
    client = _Client(view=view, echo=True)
    keeper, clock, _, registry = _keeper(view, client)
    assert keeper.step() == {"b": None}  # a quota the view cannot see must not earn "a" the fact
    assert _sample(registry, "envelope_intree_fact_last_success_timestamp_seconds") == 0.0
    view.missing = []
    clock.now += 31
    assert keeper.step() == {"a": FACT_VALUE}


def test_only_the_leader_writes_and_a_new_term_starts_with_a_full_round() -> None:
    view = _View([_ns("a")])
    client = _Client(view=view, echo=True)
    leading = [False]
    keeper, _, _, registry = _keeper(view, client, leading)
    assert keeper.step() is None and client.patches == []
    assert _sample(registry, "envelope_intree_fact_leader") == 0.0
    leading[0] = True
    assert keeper.step() == {"a": FACT_VALUE}
    assert _sample(registry, "envelope_intree_fact_leader") == 1.0
    leading[0] = False
    view.add(_ns("b"), "Namespace")
    assert keeper.step() is None and len(client.patches) == 1  # lost the Lease: stops writing
    view.add(_ns("a"), "Namespace")  # the label removed while another replica led
    leading[0] = True
    assert keeper.step() == {"a": FACT_VALUE, "b": FACT_VALUE}


def test_failed_writes_are_retried_with_backoff_and_logged_without_contents(
        caplog: pytest.LogCaptureFixture) -> None:
    view = _View([_ns("a")])
    client = _Client(view=view, echo=True)
    keeper, clock, _, registry = _keeper(view, client)
    client.fail = ApiError(403, 'namespaces "a" is forbidden: secret-looking body')
    with caplog.at_level("WARNING", logger="envelope.intree.facts"):
        assert keeper.step() == {"a": FACT_VALUE}
    assert "secret-looking" not in caplog.text
    assert [r.__dict__["fields"]["status"] for r in caplog.records] == [403]
    assert _sample(registry, "envelope_intree_fact_rounds_total", result="failed") == 1.0
    assert keeper.step() is None  # backing off (1 s)
    client.fail = ConnectionError("reset")
    clock.now += 1
    assert keeper.step() == {"a": FACT_VALUE}
    assert keeper.step() is None
    clock.now += 1.5  # the backoff doubled: not yet
    assert keeper.step() is None
    client.fail = None
    clock.now += 0.5
    assert keeper.step() == {"a": FACT_VALUE}
    assert _sample(registry, "envelope_intree_fact_rounds_total", result="ok") == 1.0
    # A namespace deleted before its write: nothing to keep, not a failure.
    view.add(_ns("gone"), "Namespace")
    client.fail = ApiError(404, "not found")
    keeper.step()
    assert _sample(registry, "envelope_intree_fact_rounds_total", result="ok") == 2.0


def test_the_selector_limits_the_namespaces() -> None:
    view = _View([_ns("a"), _ns("b", team="x")])
    client = _Client(view=view, echo=True)
    keeper, _, _, _ = _keeper(view, client, selector=parse_selector("team=x"))
    assert keeper.step() == {"b": FACT_VALUE}


def test_the_keeper_thread_runs_until_stopped() -> None:
    view = _View([_ns("a")])
    done = threading.Event()

    class Client(_Client):
        def request(self, method: str, path: str, body: Any = None, **kw: object) -> dict[str, object]:
            done.set()
            return super().request(method, path, body, **kw)

    client = Client(view=view, echo=True)
    keeper = ViewFactKeeper(client, view, lambda: True, tick=0.01)  # type: ignore[arg-type]
    keeper.start()
    try:
        assert done.wait(5)
    finally:
        keeper.stop()


# -- leadership -----------------------------------------------------------------------------

class _Elector:
    def __init__(self) -> None:
        self.answers: list[bool | Exception] = []

    def try_acquire(self) -> bool:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_leadership_ends_at_another_holder_or_after_the_renew_deadline() -> None:
    elector, clock = _Elector(), _Clock()
    lead = Leadership(elector, retry=2, deadline=10, monotonic=clock)
    assert not lead.leading()
    elector.answers = [True, ConnectionError("down"), ConnectionError("down"), False]
    lead.step()
    assert lead.leading()
    clock.now += 9
    lead.step()  # the API server unreachable: still leading until the deadline
    assert lead.leading()
    clock.now += 1
    lead.step()
    assert not lead.leading()  # 10 s without a renewal (the Lease lasts 15 s)
    lead.step()  # another replica holds it
    assert not lead.leading()


# -- the LIST keeper (python -m app.intree.facts) ----------------------------------------------

def test_fact_keeper_removes_before_it_adds() -> None:
    client = _Client({"/api/v1/namespaces": [_ns("a"), _ns("b", **{FACT_LABEL: FACT_VALUE})],
                      "/api/v1/resourcequotas": [_quota("b")]})
    keeper = FactKeeper(client, interval=0)  # type: ignore[arg-type]
    assert keeper.run_once() == {"a": FACT_VALUE, "b": None}
    assert client.patches == [(f"/api/v1/namespaces/b{PATCH}", label_patch(None)),
                              (f"/api/v1/namespaces/a{PATCH}", label_patch(FACT_VALUE))]


def test_fact_keeper_command_runs_one_round(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import app.cluster.kube
    import app.intree.facts

    client = _Client({"/api/v1/namespaces": [_ns("a")]})
    monkeypatch.setattr(app.cluster.kube, "kube_configuration", lambda path: path)
    monkeypatch.setattr(app.intree.facts, "KubeClient", lambda configuration: client)
    assert app.intree.facts.main(["--once", "--kubeconfig", "x"]) == 0
    assert capsys.readouterr().out == f"a: {FACT_LABEL}={FACT_VALUE}\n"
    assert client.patches == [(f"/api/v1/namespaces/a{PATCH}", label_patch(FACT_VALUE))]


# -- serve's flags ----------------------------------------------------------------------------

def _serve_args(*argv: str) -> Any:
    import argparse

    from app.cli.serve import _serve_parser

    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", "--port", "0", "--metrics-port", "0", *argv])


def test_serve_refuses_a_fact_keeper_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli.serve import _serve_problem

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    problem = _serve_problem(_serve_args("--in-tree-facts"))
    assert problem is not None and "--namespace" in problem
    problem = _serve_problem(_serve_args("--in-tree-facts", "--namespace", "e",
                                         "--cluster-view", "none"))
    assert problem is not None and "--cluster-view none" in problem
    problem = _serve_problem(_serve_args("--in-tree-facts", "--namespace", "e",
                                         "--in-tree-facts-selector", "team"))
    assert problem is not None and "'team' is not key=value" in problem
    assert _serve_problem(_serve_args("--in-tree-facts", "--namespace", "e")) is None
    assert _serve_problem(_serve_args()) is None  # off by default


def test_the_flag_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVELOPE_IN_TREE_FACTS", "true")
    monkeypatch.setenv("ENVELOPE_IN_TREE_FACTS_SELECTOR", "team=x")
    args = _serve_args()
    assert args.in_tree_facts and args.in_tree_facts_selector == "team=x"
    monkeypatch.setenv("ENVELOPE_IN_TREE_FACTS", "false")
    assert not _serve_args().in_tree_facts


class _LeaseClient:
    """Records the fact Lease's writes as the API server's Lease strategy takes them
    (``pkg/registry/coordination/lease/strategy.go``): a PUT creates a missing Lease
    (AllowCreateOnUpdate), an update needs the current resourceVersion
    (AllowUnconditionalUpdate is false: 422 without one, 409 with a stale one)."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.writes: list[str] = []
        self.version = 0

    def request(self, method: str, path: str, body: Any = None, **kw: object) -> dict[str, Any]:
        if method == "PATCH":  # a label write
            return {}
        self.writes.append(method)
        if method == "GET":
            if self.stored is None:
                raise ApiError(404, "not found")
            return copy.deepcopy(self.stored)
        assert method == "PUT", method
        sent = body["metadata"].get("resourceVersion")
        if self.stored is not None:
            if sent is None:
                raise ApiError(422, "metadata.resourceVersion: must be specified for an update")
            if sent != self.stored["metadata"]["resourceVersion"]:
                raise ApiError(409, "the object has been modified")
        self.version += 1
        self.stored = copy.deepcopy(body)
        self.stored["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.stored)


def test_the_fact_lease_is_renewed_only_while_the_facts_are_current() -> None:
    """Issue 38, class 5: renewed every third of its duration while leading with a synced
    view and no failing write; not renewed otherwise, so it lapses and the in-tree policy
    stops trusting the labels (e2e/test_intree_facts.py proves the lapse on the API
    server)."""
    view = _View([_ns("a")])
    client = _LeaseClient()
    clock = _Clock()
    wall = [1_800_000_000.0]
    lease = FactLease(client, "ns", "envelope-leader-facts", "pod-0", duration=30,  # type: ignore[arg-type]
                      clock=lambda: wall[0], monotonic=clock)
    lead = [True]
    keeper = ViewFactKeeper(client, view, lambda: lead[0], monotonic=clock, lease=lease)  # type: ignore[arg-type]
    keeper.step()
    assert client.writes == ["PUT"]  # missing: a PUT creates it
    assert client.stored is not None and client.stored["spec"] == {
        "holderIdentity": "pod-0", "leaseDurationSeconds": 30,
        "renewTime": "2027-01-15T08:00:00.000000Z"}
    clock.now += 5
    keeper.step()
    assert client.writes == ["PUT"]  # within a third of the duration: no write
    clock.now += 6
    wall[0] += 11
    keeper.step()
    assert client.writes == ["PUT", "PUT"]  # with the resourceVersion it last wrote
    assert client.stored["spec"]["renewTime"] == "2027-01-15T08:00:11.000000Z"
    # the view loses a watch: no renewal, however long
    view.missing = ["ResourceQuota watch lost"]
    for _ in range(5):
        clock.now += 11
        keeper.step()
    assert client.writes == ["PUT", "PUT"]
    view.missing = []
    keeper.step()
    assert client.writes[-1] == "PUT" and len(client.writes) == 3
    # not leading: no renewal; leading again: renewed at once
    lead[0] = False
    clock.now += 11
    keeper.step()
    assert len(client.writes) == 3
    lead[0] = True
    keeper.step()
    assert len(client.writes) == 4
    # another replica wrote it meanwhile: read again, then written
    client.stored["metadata"]["resourceVersion"] = "99"
    client.version = 99
    clock.now += 11
    keeper.step()
    assert client.writes[-3:] == ["PUT", "GET", "PUT"] and client.stored["spec"]["holderIdentity"] == "pod-0"


def test_a_replica_renews_a_lease_another_created() -> None:
    """A new replica knows no resourceVersion: the API server refuses its PUT (422), it
    reads the Lease and writes again."""
    client = _LeaseClient()
    FactLease(client, "ns", "l", "pod-0").renew()  # type: ignore[arg-type]
    fresh = FactLease(client, "ns", "l", "pod-1")  # type: ignore[arg-type]
    assert fresh.renew()
    assert client.writes == ["PUT", "PUT", "GET", "PUT"]
    assert client.stored is not None and client.stored["spec"]["holderIdentity"] == "pod-1"

