"""What the webhook reads and keeps of an EnvelopeException (app/crds/exceptions.py): parsed
as the CRD's schema allows, and trimmed to a bounded size however large the stored
object is."""

from __future__ import annotations

import orjson

from app.cluster.live import resources_for
from app.crds.exceptions import MAX_ITEMS, MAX_NAME, MAX_REASON, parse, trim


def stored(**spec: object) -> dict[str, object]:
    return {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
            "metadata": {"name": "e", "namespace": "a", "resourceVersion": "7",
                         "annotations": {"big": "x" * 100_000},
                         "managedFields": [{"manager": "kubectl"}] * 100},
            "spec": {"rules": ["cpu-limits"], "match": {"names": ["web"]}, **spec},
            "status": {"anything": "y" * 10_000}}


def test_the_trim_keeps_what_the_engine_reads_and_is_bounded() -> None:
    huge = stored(reason="r" * 100_000, match={"names": ["n" * 10_000] * 1_000,
                                               "kinds": ["Deployment"] * 1_000,
                                               "selector": {"matchLabels": {f"k{i}": "v" * 5_000
                                                                            for i in range(1_000)}},
                                               "other": "dropped"})
    kept = trim(huge)
    assert kept["metadata"] == {"name": "e", "namespace": "a", "resourceVersion": "7"}
    assert set(kept["spec"]["match"]) == {"names", "kinds", "selector"}
    assert len(kept["spec"]["match"]["names"]) == MAX_ITEMS
    assert len(kept["spec"]["reason"]) == MAX_REASON
    size = len(orjson.dumps(kept))
    assert size < 3 * MAX_ITEMS * (MAX_NAME + 8) + 1_024, size
    # the small one is read as it was written
    exception, problems = parse(trim(stored(reason="vendor")))
    assert problems == [] and exception is not None
    assert (exception.rules, exception.names, exception.reason) == (("cpu-limits",), ("web",), "vendor")


def test_the_live_view_trims_it_so() -> None:
    [resource] = resources_for({"EnvelopeException"})
    assert resource.path == "/apis/envelope.io/v1alpha1/envelopeexceptions" and resource.optional
    assert resource.trim(stored()) == trim(stored())
