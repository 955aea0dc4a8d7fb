"""What the webhook reads and keeps of an EnvelopeException (app/crds/exceptions.py): parsed
as the CRD's schema allows, and trimmed to a bounded size however large the stored
object is."""

from __future__ import annotations

import re

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.cluster.live import resources_for
from app.crds.exceptions import MAX_BYTES, MAX_ITEMS, MAX_NAME, MAX_REASON, parse, trim


def stored(**spec: object) -> dict[str, object]:
    return {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
            "metadata": {"name": "e", "namespace": "a", "resourceVersion": "7",
                         "annotations": {"big": "x" * 100_000},
                         "managedFields": [{"manager": "kubectl"}] * 100},
            "spec": {"rules": ["cpu-limits"], "match": {"names": ["web"]}, **spec},
            "status": {"anything": "y" * 10_000}}


def test_the_trim_keeps_what_the_engine_reads_and_is_bounded() -> None:
    cut = stored(reason="r" * 100_000, match={"names": ["n" * 10_000] * 1_000,
                                              "kinds": ["Deployment"] * 1_000, "other": "dropped"})
    kept = trim(cut)
    assert kept["metadata"] == {"name": "e", "namespace": "a", "resourceVersion": "7"}
    assert set(kept["spec"]["match"]) == {"names", "kinds"}
    assert len(kept["spec"]["match"]["names"]) == MAX_ITEMS
    assert {len(n) for n in kept["spec"]["match"]["names"]} == {MAX_NAME}
    assert len(kept["spec"]["reason"]) == MAX_REASON
    assert len(orjson.dumps(kept)) <= MAX_BYTES + 256
    # Every list and string at its limit still makes a quarter of a MiB of selector: kept
    # as its size alone, and read as refused.
    expression = {"key": "k" * MAX_NAME, "operator": "In", "values": ["v" * MAX_NAME] * MAX_ITEMS}
    huge = stored(match={"names": ["web"], "selector": {"matchExpressions": [expression] * 1_000}})
    kept = trim(huge)
    assert len(orjson.dumps(kept)) < 512, kept
    for read in (kept, huge):  # what the view keeps, and what the webhook is sent
        exception, problems = parse(read)
        assert exception is None and len(problems) == 1, problems
        assert re.fullmatch(r"spec: [0-9,]{7,} bytes of JSON, over the 16,384 an exception may "
                            r"hold; .*", problems[0]), problems
    # the small one is read as it was written
    exception, problems = parse(trim(stored(reason="vendor")))
    assert problems == [] and exception is not None
    assert (exception.rules, exception.names, exception.reason) == (("cpu-limits",), ("web",), "vendor")


def test_the_live_view_trims_it_so() -> None:
    [resource] = resources_for({"EnvelopeException"})
    assert resource.path == "/apis/envelope.io/v1alpha1/envelopeexceptions" and resource.optional
    assert resource.trim(stored()) == trim(stored())


@given(st.text(alphabet="ab-.", max_size=12), st.text(alphabet="ab-.*?", max_size=12))
def test_wildcard_match_is_fnmatch_without_its_cache(name: str, pattern: str) -> None:
    """``*`` and ``?`` as fnmatch reads them (names hold no ``[``), without fnmatch's
    count-bounded cache of compiled patterns."""
    import fnmatch

    from app.crds.exceptions import wildcard_match

    assert wildcard_match(name, pattern) == fnmatch.fnmatchcase(name, pattern)


def test_a_name_longer_than_any_kubernetes_name_is_covered_by_no_pattern() -> None:
    """The mutating webhook sees names before the API server validates them: 3 MB of
    ``a`` against ``*a…ab`` would take minutes (len(name) * len(pattern) steps)."""
    from app.crds.exceptions import wildcard_match

    worst = "*" + "a" * (MAX_NAME - 2) + "b"
    assert not wildcard_match("a" * 3_000_000, worst)
    assert not wildcard_match("a" * (MAX_NAME + 1), "*")
    assert wildcard_match("a" * MAX_NAME, "*") and wildcard_match("a" * (MAX_NAME - 1) + "b", worst)
