"""One Envelope live view under measurement, driven by ``bench/cluster_memory.py``.

Usage: ``python bench/cluster_memory_child.py SOURCE_TREE KUBECONFIG``. Imports
``app`` from SOURCE_TREE (so the same driver measures the previous code and the
current one), imports what ``envelope serve`` imports, starts the live view on every
resource and prints one JSON line per step: ``synced`` once every informer has listed,
then one per command read from stdin (``relist``: every informer lists again, as after
a 410 Gone; ``rss``: just measure; ``quit``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def _status() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    return out


def main() -> int:
    tree, kubeconfig = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    import orjson

    import app.serve.server  # noqa: F401  (what serve imports: FastAPI, rules, engine)
    from app.cluster.kube import kube_configuration
    from app.cluster.live import RESOURCES, LiveView

    def say(event: str, **fields: Any) -> None:
        sys.stdout.write(orjson.dumps({"event": event, **_status(), **fields}).decode() + "\n")
        sys.stdout.flush()

    say("imported")
    started = time.monotonic()
    view = LiveView(kube_configuration(kubeconfig), RESOURCES)  # every resource
    view.start()
    while any(not i.synced for i in view.informers):
        time.sleep(0.2)
    counts = {i.resource.kind: view.count(i.resource.kind) for i in view.informers}
    say("synced", seconds=round(time.monotonic() - started, 1), counts=counts)
    for line in sys.stdin:
        command = line.strip()
        if command == "relist":
            started = time.monotonic()
            for informer in view.informers:
                if not informer.absent:
                    informer.list()
            say("relisted", seconds=round(time.monotonic() - started, 1))
        elif command == "rss":
            events = sum(i.events for i in view.informers)
            say("rss", events=events,
                counts={i.resource.kind: view.count(i.resource.kind) for i in view.informers})
        elif command == "quit":
            break
    view.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
