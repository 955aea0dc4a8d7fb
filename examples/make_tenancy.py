"""Write a KAI tenancy (NodePools, Nodes, Departments, Projects, Queues) as YAML files.

    python examples/make_tenancy.py                      # the demo in examples/tenancy/
    python examples/make_tenancy.py --scale 1000 --out /tmp/big    # 1,000 departments

The demo: 160 GPUs on 20 nodes in two node pools (12 H100 nodes, 8 RTX PRO 6000 nodes,
8 cards each), 8 departments, 48 projects, and a small KAI Queue tree that KRM does not
manage. It has exactly one deliberate mistake: department ``research`` was given 8 more
H100 cards than the pool has room for (56 instead of 48), so the H100 pool is promised
104 cards on 96.

``--scale N`` writes N departments of 10 projects each over 50 labelled pools and 5
nodes per department (the benchmark's 10,000-project tenancy is ``--scale 1000``),
with no mistakes. Files are written with aligned flow mappings, the way people keep
tenancy files by hand; the output is deterministic.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KRM = "kai.resources/v1alpha1"
GPU_PRODUCT = "nvidia.com/gpu.product"
H100, RTX = "h100", "rtx-pro-6000"
PRODUCTS = {H100: "NVIDIA-H100-80GB-HBM3", RTX: "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"}
CARDS_PER_NODE = 8


@dataclass
class Quota:
    """One queue on one pool: gpu in cards, cpu in mCPU, memory in MB (-1 = unlimited)."""

    pool: str
    gpu: tuple[float, float]
    cpu: tuple[float, float] = (0, -1)
    memory: tuple[float, float] = (0, -1)
    weight: int = 1


@dataclass
class Tenant:
    kind: str
    name: str
    quotas: list[Quota]
    parent: str = ""
    namespace: str = ""
    comment: str = ""
    default_pools: list[str] = field(default_factory=list)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _resource(name: str, pair: tuple[float, float], weight: int) -> str:
    deserved, limit = (_num(v) + "," for v in pair)
    return (f"        {name + ':':<7} {{deserved: {deserved:<8} limit: {limit:<4} "
            f"overQuotaWeight: {weight}}}")


def _tenant_yaml(t: Tenant) -> str:
    lines = [f"# {t.comment}"] if t.comment else []
    lines += [f"apiVersion: {KRM}", f"kind: {t.kind}", "metadata:", f"  name: {t.name}", "spec:"]
    if t.kind == "Project":
        lines.append(f"  parent: {t.parent}")
        if t.namespace:
            lines.append(f"  namespace: {t.namespace}")
        lines.append(f"  defaultNodePools: [{', '.join(t.default_pools)}]")
    lines.append("  queues:")
    for q in t.quotas:
        lines += [f"    - name: {t.name}-{q.pool}", f"      nodepool: {q.pool}", "      resources:",
                  _resource("gpu", q.gpu, q.weight), _resource("cpu", q.cpu, q.weight),
                  _resource("memory", q.memory, q.weight)]
    return "\n".join(lines) + "\n"


def _node_yaml(name: str, pool_label: tuple[str, str], cards: int) -> str:
    key, value = pool_label
    return "\n".join([
        "apiVersion: v1", "kind: Node", "metadata:", f"  name: {name}", "  labels:",
        f"    {key}: {value}", f'    nvidia.com/gpu.count: "{cards}"',
        f"    kubernetes.io/hostname: {name}", "status:",
        f'  capacity:    {{cpu: "128", memory: 2063731Mi, nvidia.com/gpu: "{cards}"}}',
        f'  allocatable: {{cpu: "126", memory: 2000000Mi, nvidia.com/gpu: "{cards}"}}',
    ]) + "\n"


def _pool_yaml(name: str, key: str, value: str) -> str:
    return (f"apiVersion: {KRM}\nkind: NodePool\nmetadata:\n  name: {name}\n"
            f"spec:\n  labelKey: {key}\n  labelValue: {value}\n")


def _docs(parts: Iterable[str]) -> str:
    return "---\n".join(parts)


# --- the demo -------------------------------------------------------------------------

DEPARTMENTS = ["platform", "research", "vision", "speech", "nlp", "robotics", "recsys", "infra"]
PROJECT_NAMES = ["train", "eval", "serve", "data", "sandbox", "bench"]
H100_SHARE = {"research": 48, "nlp": 32, "vision": 16}
"""H100 cards per department: 96, exactly the pool."""
RTX_SPLIT = [2, 2, 1, 1, 1, 1]
"""Each department's 8 RTX cards over its six projects."""
CPU_PER_RTX_CARD, MEMORY_PER_RTX_CARD = 8000, 240000
MISTAKE = ("research", 56)


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def demo() -> dict[str, str]:
    """File name -> YAML text of the demo tenancy."""
    files: dict[str, str] = {}
    files["nodepools.yaml"] = _docs(_pool_yaml(p, GPU_PRODUCT, PRODUCTS[p]) for p in (H100, RTX))
    nodes = [(f"dgx-h100-{i:02d}", H100) for i in range(1, 13)]
    nodes += [(f"rtx-{i:02d}", RTX) for i in range(1, 9)]
    files["nodes.yaml"] = _docs(_node_yaml(n, (GPU_PRODUCT, PRODUCTS[p]), CARDS_PER_NODE)
                                for n, p in nodes)
    departments = []
    for dept in DEPARTMENTS:
        quotas = [Quota(RTX, (8, 16), (8 * CPU_PER_RTX_CARD, -1), (8 * MEMORY_PER_RTX_CARD, -1))]
        h100 = H100_SHARE.get(dept, 0)
        comment = ""
        if dept == MISTAKE[0]:
            h100 = MISTAKE[1]
            comment = "48 H100 cards are split among the projects; 8 more are held for a new team"
        if h100:
            quotas.insert(0, Quota(H100, (h100, 64), (0, -1), (0, -1), weight=2))
        departments.append(Tenant("Department", dept, quotas, comment=comment))
        files[f"projects/{dept}.yaml"] = _docs(_tenant_yaml(p) for p in _demo_projects(dept))
    files["departments.yaml"] = _docs(_tenant_yaml(d) for d in departments)
    files["queues.yaml"] = _queue_tree()
    return files


def _demo_projects(dept: str) -> list[Tenant]:
    h100 = _split(H100_SHARE.get(dept, 0), len(PROJECT_NAMES))
    out = []
    for i, suffix in enumerate(PROJECT_NAMES):
        rtx = RTX_SPLIT[i]
        quotas = [Quota(RTX, (rtx, 8), (rtx * CPU_PER_RTX_CARD, -1), (rtx * MEMORY_PER_RTX_CARD, -1))]
        pools = [RTX]
        if h100[i]:
            quotas.insert(0, Quota(H100, (h100[i], 32), (0, -1), (0, -1), weight=2))
            pools.insert(0, H100)
        namespace = f"{dept}-{suffix}" if suffix == "serve" else ""
        out.append(Tenant("Project", f"{dept}-{suffix}", quotas, parent=dept, namespace=namespace,
                          default_pools=pools))
    return out


def _queue_tree() -> str:
    """A KAI Queue tree outside KRM (an inference team's), quota/limit in the same units."""
    def queue(name: str, parent: str, gpu: tuple[int, int], priority: int) -> str:
        lines = ["apiVersion: scheduling.run.ai/v2", "kind: Queue", "metadata:", f"  name: {name}",
                 "spec:", f"  displayName: {name}"]
        if parent:
            lines.append(f"  parentQueue: {parent}")
        lines += [f"  priority: {priority}", "  resources:",
                  f"    gpu:    {{quota: {gpu[0]}, limit: {gpu[1]}, overQuotaWeight: 1}}",
                  "    cpu:    {quota: 0, limit: -1, overQuotaWeight: 1}",
                  "    memory: {quota: 0, limit: -1, overQuotaWeight: 1}"]
        return "\n".join(lines) + "\n"

    return _docs([queue("inference", "", (0, -1), 100),
                  queue("inference-online", "inference", (0, 8), 150),
                  queue("inference-batch", "inference", (0, 4), 50)])


# --- a large tenancy (benchmarks) -----------------------------------------------------

def scaled(departments: int, projects_per_department: int = 10, pools: int = 50,
           nodes_per_department: int = 5) -> dict[str, str]:
    """A consistent tenancy of any size: each department owns one queue on one of
    ``pools`` labelled pools and ``nodes_per_department`` nodes of 8 cards in it, and
    leaves room to grow (one card per department in the pool, two per department for
    its projects)."""
    files: dict[str, str] = {}
    pool_names = [f"pool-{i:02d}" for i in range(pools)]
    files["nodepools.yaml"] = _docs(_pool_yaml(p, "kai.example/pool", p) for p in pool_names)
    node_docs, dept_docs = [], []
    for d in range(departments):
        pool = pool_names[d % pools]
        name = f"dept-{d:04d}"
        node_docs += [_node_yaml(f"node-{d:04d}-{n}", ("kai.example/pool", pool), CARDS_PER_NODE)
                      for n in range(nodes_per_department)]
        cards = nodes_per_department * CARDS_PER_NODE - 1  # the pool keeps a card per department spare
        dept_docs.append(_tenant_yaml(Tenant("Department", name, [Quota(pool, (cards, -1))])))
        shares = _split(cards - 2, projects_per_department)  # departments keep 2 cards spare
        projects = [Tenant("Project", f"{name}-p{p:02d}", [Quota(pool, (share, -1))], parent=name,
                           default_pools=[pool]) for p, share in enumerate(shares)]
        files[f"projects/{name}.yaml"] = _docs(_tenant_yaml(p) for p in projects)
    files["nodes.yaml"] = _docs(node_docs)
    files["departments.yaml"] = _docs(dept_docs)
    return files


def write(files: dict[str, str], out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "tenancy")
    parser.add_argument("--scale", type=int, default=0,
                        help="write N departments x 10 projects instead of the demo")
    args = parser.parse_args(argv)
    write(scaled(args.scale) if args.scale else demo(), args.out)
    print(f"wrote {args.out}")
    return 0


def load(text: str) -> list[dict[str, Any]]:
    """The objects of one generated file (for the benchmark, which skips the disk)."""
    import yaml

    return [doc for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if doc]


if __name__ == "__main__":
    raise SystemExit(main())
