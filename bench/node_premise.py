"""The premise, timed: the same fixed CPU work in a pod with a CPU limit (as written) and
through Envelope (the limit removed, the request kept), each alone on a real node
(containerd, runc, the kubelet at the e2e version; e2e/harness/node.py), side by side in
one run. Run by hand (`make bench-node`), recorded in docs/benchmarks.md ("The node"); never
a timed assertion in the tests (e2e/test_node_premise.py checks the cgroup values).

Shapes (``--shapes``):

- ``parallel``: a job sized for the node — one process per core, each doing
  ``--iterations`` loop turns — with requests = limits = half the node's cores (the
  incident: a run capped at its limit while the rest of the node sat idle);
- ``single``: one process, limit 500m (a service capped at half a core);
- ``tenth``: one process, limit 100m: a limit below what even a busy shared machine leaves
  the pod (on the 2-core VMs at load ~24 a busy pod gets ~0.15-0.2 of a core), so it binds
  where the two above do not.

For each shape and ``--repeat`` rounds (limited and stripped alternating, so load drifts
hit both), the pod's containers print /proc/uptime before and after the work; the time
to finish is the difference (10 ms resolution), the CPU time is the pod cgroup's
cpuacct.usage, and cpu.stat gives the throttled periods. Prints a table and a JSON
document (``--json``) with the date, ``uptime``'s load and the node's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT))

import nodepods as p  # noqa: E402

import harness  # noqa: E402

WORK = 'i=0; while [ "$i" -lt {n} ]; do i=$((i+1)); done'


def _script(procs: int, iterations: int) -> str:
    work = WORK.format(n=iterations)
    parallel = " ".join([f"({work}) &"] * procs) + " wait" if procs > 1 else work
    return f"read a _ < /proc/uptime; {parallel}; read b _ < /proc/uptime; echo \"took $a $b\""


def _run(env: dict[str, Any], ns: str, name: str, cpu: str, procs: int, iterations: int) -> dict[str, Any]:
    cluster, node = env["cluster"], env["node"]
    res = {"cpu": cpu, "memory": "32Mi"}
    stored, _ = p.create(cluster, p.pod(name, ns, node, p.box("work", _script(procs, iterations),
                                                              requests=res, limits=res)))
    running = p.wait_for(node, f"{name} started", ns, name,
                         lambda x: bool(p.container_state(x, "work").get("containerID")), timeout=120)
    cpu_dir = node.cgroup("cpu", node.pod_cgroup_dir(running))
    acct_dir = node.cgroup("cpuacct", node.pod_cgroup_dir(running))
    quota = p.read_int(cpu_dir / "cpu.cfs_quota_us") if cpu_dir.exists() else None
    last: dict[str, Any] = {}

    def sample() -> None:
        if acct_dir.exists():
            last["usage"] = p.read_int(acct_dir / "cpuacct.usage")
            last["stat"] = p.cpu_stat(cpu_dir)

    def finished(x: dict[str, Any]) -> bool:
        sample()
        return "terminated" in (p.container_state(x, "work").get("state") or {})

    done = p.wait_for(node, f"{name} finished", ns, name, finished, timeout=1800)
    log = node.container_log(done, "work")
    line = [w for w in log.split("\n") if "took " in w][-1]
    a, b = (float(x) for x in line.split("took ", 1)[1].split()[:2])
    p.delete(cluster, ns, name)
    return {"name": name, "limits_cpu": (stored["spec"]["containers"][0]["resources"].get("limits") or {})
            .get("cpu"), "quota_us": quota, "seconds": round(b - a, 2),
            "cpu_seconds": round(last.get("usage", 0) / 1e9, 2),
            "throttled": (last.get("stat") or {}).get("nr_throttled"),
            "periods": (last.get("stat") or {}).get("nr_periods")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="parallel,single,tenth")
    parser.add_argument("--iterations", type=int, default=1_000_000,
                        help="loop turns per process (busybox sh; ~2 s of one core per million here)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    bin_dir = harness.locate_bin_dir()
    with tempfile.TemporaryDirectory(prefix="envelope-bench-node-") as tmp:
        work = Path(tmp)
        cluster = harness.start_control_plane(work / "cp", bin_dir,
                                              apiserver_args=["--kubelet-preferred-address-types=InternalIP"])
        webhook = node = None
        try:
            harness.install_crds(cluster)
            webhook = harness.start_webhook(work / "webhook", kubeconfig=cluster.kubeconfig)
            harness.register_webhook(cluster, webhook)
            node = harness.start_node(cluster, work / "n")
            env = {"cluster": cluster, "node": node}
            plain = cluster.create_namespace("bench-limited",
                                             labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
            judged = cluster.create_namespace("bench-envelope")
            results: dict[str, Any] = {
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "load_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                "cores": cores, "iterations": args.iterations, "shapes": {}}
            for shape in args.shapes.split(","):
                procs, cpu = {"parallel": (cores, f"{cores * 500}m"), "single": (1, "500m"),
                              "tenth": (1, "100m")}[shape]
                rounds: dict[str, list[dict[str, Any]]] = {"limited": [], "envelope": []}
                for r in range(args.repeat):
                    for label, ns in (("limited", plain), ("envelope", judged)) if r % 2 == 0 else \
                            (("envelope", judged), ("limited", plain)):
                        got = _run(env, ns, f"{shape}-{label}-{r}", cpu, procs, args.iterations)
                        rounds[label].append(got)
                        print(f"{shape:8} {label:8} round {r}: {got['seconds']:7.2f} s, "
                              f"cpu {got['cpu_seconds']:6.2f} s, quota {got['quota_us']}, "
                              f"throttled {got['throttled']}/{got['periods']}", flush=True)
                med = {k: statistics.median(x["seconds"] for x in v) for k, v in rounds.items()}
                results["shapes"][shape] = {"processes": procs, "requests_cpu": cpu, "rounds": rounds,
                                            "median_seconds": med,
                                            "speedup": round(med["limited"] / med["envelope"], 2)}
                print(f"{shape}: limited {med['limited']:.2f} s, through Envelope {med['envelope']:.2f} s "
                      f"(median of {args.repeat}): {med['limited'] / med['envelope']:.2f}x")
            results["load_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            print(json.dumps(results, indent=1))
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
        finally:
            if node is not None:
                node.stop()
                left = node.leftovers()
                if left:
                    print(f"the node left behind: {left}", file=sys.stderr)
            if webhook is not None:
                webhook.stop()
            cluster.stop()


if __name__ == "__main__":
    main()
