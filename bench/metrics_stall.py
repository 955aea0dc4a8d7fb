"""Can metrics clients stall admission reviews? Previous code vs current.

Run by hand (``.venv/bin/python bench/metrics_stall.py``). For each code version (a
``git archive`` of ``--baseline`` and of ``--current``) it starts the real
``envelope serve`` (self-signed, no cluster view) on 127.0.0.1, sends validate
reviews from ``--clients`` keep-alive HTTPS connections and records each review's
latency: ``--seconds`` of quiet; then a window of ``--seconds`` during which 16
threads open up to ``--attack`` half-open ``GET /metrics`` connections against the
metrics port (the request head never finished) and hold them to the window's end;
then quiet again after they are closed. Reports p50/p99/max and failures per phase, and
``/healthz`` latency during the attack.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from webhook import review_body  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_tree(ref: str, into: Path) -> Path:
    archive = into / f"{ref}.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref, "app"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / ref, filter="data")
    return into / ref


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float], failures: int) -> dict[str, Any]:
    ms = [s * 1000 for s in samples]
    return {"reviews": len(ms), "failed": failures,
            "p50_ms": round(pct(ms, 0.50), 2), "p99_ms": round(pct(ms, 0.99), 2),
            "p999_ms": round(pct(ms, 0.999), 2), "over_1s": len([m for m in ms if m > 1000]),
            "max_ms": round(max(ms), 1) if ms else None,
            "mean_ms": round(statistics.fmean(ms), 2) if ms else None}


def run(tree: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    port, metrics_port = free_port(), free_port()
    certs = workdir / f"certs-{tree.name}"
    log = (workdir / f"serve-{tree.name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--self-signed", "--self-signed-dir", str(certs),
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
         "--cluster-view", "none", "--log-level", "warning"],
        cwd=tree, stdout=log, stderr=log)
    try:
        context = ssl.create_default_context(cafile=None)
        deadline = time.monotonic() + 30
        while not (certs / "ca.crt").exists() or not _up(port, certs):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"serve did not start: {log.name}")
            time.sleep(0.2)
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        body = review_body()
        samples: list[tuple[float, float]] = []  # (start time, latency)
        failures: list[float] = []
        stop = threading.Event()

        def client() -> None:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    conn.request("POST", "/validate", body,
                                 {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    response.read()
                    if response.status != 200:
                        raise RuntimeError(response.status)
                    samples.append((started, time.monotonic() - started))
                except (OSError, RuntimeError, http.client.HTTPException):
                    failures.append(started)
                    conn.close()
                    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context,
                                                       timeout=30)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        marks = {"quiet": time.monotonic()}
        time.sleep(args.seconds)
        marks["attack"] = time.monotonic()
        window_end = marks["attack"] + args.seconds
        held: list[socket.socket] = []
        lock = threading.Lock()

        def attacker(n: int) -> None:
            for _ in range(n):
                if time.monotonic() >= window_end:
                    return
                with contextlib.suppress(OSError):
                    s = socket.create_connection(("127.0.0.1", metrics_port), timeout=5)
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
                    with lock:
                        held.append(s)

        attackers = [threading.Thread(target=attacker, args=(args.attack // 16,))
                     for _ in range(16)]
        for t in attackers:
            t.start()
        health: list[float] = []
        while time.monotonic() < window_end:
            started = time.monotonic()
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                health.append(time.monotonic() - started)
            except (OSError, http.client.HTTPException):
                health.append(float("inf"))
            finally:
                conn.close()
            time.sleep(0.1)
        for t in attackers:
            t.join(30)
        opened = len(held)
        marks["after"] = time.monotonic()
        for s in held:
            s.close()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join(60)
        end = time.monotonic()

        def phase(a: str, b: float) -> dict[str, Any]:
            start = marks[a]
            return summary([lat for t0, lat in samples if start <= t0 < b],
                           len([t0 for t0 in failures if start <= t0 < b]))

        return {"quiet": phase("quiet", marks["attack"]),
                "attack": phase("attack", marks["after"]),
                "after": phase("after", end),
                "attack_connections_opened_in_window": opened,
                "healthz_during_attack_max_ms": round(max(health) * 1000, 1) if health else None}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _up(port: int, certs: Path) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="6ced6e6")
    parser.add_argument("--current", default="HEAD")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--attack", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="envelope-metrics-stall-"))
    current = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.current],
                             capture_output=True, text=True, check=True).stdout.strip()
    results: dict[str, Any] = {"conditions": {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "baseline": args.baseline,
        "current": current, "clients": args.clients, "attack": args.attack,
        "seconds_per_phase": args.seconds}}
    for label, ref in (("previous", args.baseline), ("current", current)):
        results[label] = run(export_tree(ref, workdir), workdir, args)
        print(label, json.dumps(results[label]), flush=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
