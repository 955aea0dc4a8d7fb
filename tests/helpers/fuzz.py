"""The sample objects the fuzz tests break."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.conftest import RULES

KINDS = sorted({(group, kind) for rule in RULES.values() for group, kind in rule.kinds})


VERSIONS = {"": "v1", "apps": "v1", "batch": "v1", "kai.resources": "v1alpha1",
            "scheduling.run.ai": "v2", "ate.dev": "v1alpha1", "envelope.io": "v1alpha1"}


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(["", "1", "-1", "1Gi", "250m", "cpu=1,memory=1Gi", "x",
                                     "gvisor", "microvm", "Always", "default"]))


keys = st.sampled_from(["spec", "template", "containers", "initContainers", "resources", "limits",
                        "requests", "cpu", "memory", "nvidia.com/gpu", "env", "name", "value",
                        "queues", "nodepool", "gpu", "deserved", "limit", "quota", "parent",
                        "parentQueue", "sandboxClass", "workerSelector", "replicas", "metadata",
                        "labels", "annotations", "jobTemplate", "nodeSelector", "overhead",
                        "labelKey", "labelValue", "namespace", "defaultNodePools", "priority",
                        "rules", "match", "names", "kinds", "selector", "expires"])


json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


@st.composite
def objects(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    group, kind = draw(st.sampled_from(KINDS))
    body = draw(st.dictionaries(keys, json_values, max_size=4))
    body.update({"apiVersion": f"{group}/{VERSIONS[group]}" if group else "v1", "kind": kind})
    if draw(st.booleans()):
        body["metadata"] = {"name": "x", "namespace": "ns"}
    return group, kind, body
