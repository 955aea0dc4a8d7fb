"""Memory-backed volumes under the memory limit Envelope writes (app/rules/workloads/memory.py,
issue 37 class 11): a tmpfs larger than the pod's new memory limit is warned about."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import container, run, workload


def _shm(obj: dict[str, Any], size: str | None = "20Gi", medium: str = "Memory") -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"]
    empty_dir: dict[str, Any] = {"medium": medium}
    if size is not None:
        empty_dir["sizeLimit"] = size
    spec["volumes"] = [{"name": "cache", "emptyDir": {}}, {"name": "dshm", "emptyDir": empty_dir}]
    return obj


def _volume_warnings(result: Any) -> list[tuple[str, str, str]]:
    return [(f.rule, f.path, f.message) for f in result.findings
            if f.severity == "warning" and "sizeLimit" in f.message]


def test_a_memory_volume_larger_than_the_limit_written_from_the_request_is_warned() -> None:
    """vLLM's shape: a 20Gi /dev/shm with a 16Gi memory request and no limit; the limit
    Envelope writes makes the tmpfs 16Gi (the kubelet's calculateEmptyDirMemorySize)."""
    obj = _shm(workload("Deployment", [container("vllm", requests={"memory": "16Gi"})]))
    assert _volume_warnings(run(obj)) == [(
        "memory-limit", "spec.template.spec.volumes[1].emptyDir.sizeLimit",
        'volume "dshm" (emptyDir, medium Memory): sizeLimit 20Gi > pod memory limit 16Gi set '
        "from the requests; the tmpfs holds at most 16Gi: raise the memory request by what "
        "the volume holds, or lower sizeLimit")]
    # the pod's limit is the sum of its containers' and sidecars' (PodLimits): 18Gi
    two = workload("Pod", [container("a", requests={"memory": "8Gi"}),
                           container("b", requests={"memory": "8Gi"})],
                   init=[container("proxy", requests={"memory": "2Gi"}, restartPolicy="Always")])
    assert _volume_warnings(run(_shm(two, "18Gi"))) == []
    [(_, path, message)] = _volume_warnings(run(_shm(two, "19Gi")))
    assert path == "spec.volumes[1].emptyDir.sizeLimit"
    assert "sizeLimit 19Gi > pod memory limit 18Gi" in message


@pytest.mark.parametrize(("containers_", "pod_limit", "size", "medium"), [
    ([container("vllm", requests={"memory": "16Gi"})], None, "16Gi", "Memory"),  # fits exactly
    ([container("vllm", requests={"memory": "16Gi"})], None, None, "Memory"),  # no size asked
    ([container("vllm", requests={"memory": "16Gi"})], None, "20Gi", ""),  # disk-backed
    # a container without a request stays unlimited: no pod limit, no cap
    ([container("vllm", requests={"memory": "16Gi"}), container("side")], None, "20Gi", "Memory"),
    # the pod-level limit decides, and Envelope did not write it
    ([container("vllm", requests={"memory": "16Gi"})], "32Gi", "20Gi", "Memory"),
    # a pod-level limit the user wrote already caps the volume: not Envelope's doing
    ([container("vllm", requests={"memory": "16Gi"})], "16Gi", "20Gi", "Memory"),
])
def test_no_volume_warning(containers_: list[dict[str, Any]], pod_limit: str | None,
                           size: str | None, medium: str) -> None:
    obj = workload("Deployment", containers_,
                   pod_resources={"limits": {"memory": pod_limit}} if pod_limit else None)
    assert _volume_warnings(run(_shm(obj, size, medium))) == []
