"""``envelope serve --config``: the policy file reloaded without a restart (issue 35).

A ConfigMap volume changes by an atomic swap of the ``..data`` symlink (kubernetes
pkg/volume/util/atomic_writer.go), so the file is polled every ``interval`` seconds
through its resolved path (``os.stat``: a new inode, device, mtime or size), read once,
digested and, when the digest differs, parsed by the loader used at start
(``config.parse_policy``). A good file is swapped in with one assignment (``apply``):
reviews in flight finish with the policy they started with. A bad one is refused: the
old policy keeps serving, one WARNING names the file and the error, and
``envelope_policy_reload_failures_total`` counts it. SIGHUP is not used: ``serve``
drains and stops on it (app/serve/serving.py). docs/configuration.md, "Live reload".
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from app.core.config import ConfigError, KnownRules, Policy, parse_policy

__all__ = ["DIGEST_SHOWN", "PolicyReloader", "ReloadMetrics"]

log = logging.getLogger("envelope")

#: Hex digits of the sha256 shown in metrics, logs and /readyz (as git's short ids).
DIGEST_SHOWN = 12
#: Every this many polls the file is read and digested even when its stat is unchanged.
DIGEST_EVERY = 30


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows the ..data symlink: a swap is a new inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class PolicyReloader:
    """The policy serving, its generation and digest, and the thread that reloads it.

    ``apply`` installs a new policy (one assignment); ``accept`` may refuse a policy
    this start cannot serve, returning why. ``environ`` as ``config.load_policy``."""

    def __init__(self, path: str | Path, rules: KnownRules, apply: Callable[[Policy], None],
                 *, accept: Callable[[Policy], str | None] | None = None,
                 environ: Mapping[str, str] | None = None, interval: float = 2.0) -> None:
        self.path = Path(path)
        self.rules = rules
        self.apply = apply
        self.accept = accept
        self.environ = environ
        self.interval = interval
        self.generation = 0
        self.sha256 = ""
        self.failures = 0
        self.last_error = ""
        self._stat: tuple[int, int, int, int] | None = None
        self._refused: tuple[str, str] | None = None  # (digest, error) last logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def load_initial(self) -> Policy:
        """Read, parse and install the file as generation 1; raises ConfigError."""
        self._stat = _stat_key(self.path)
        data = self._read()
        policy = self._parse(data)
        self._install(policy, hashlib.sha256(data).hexdigest())
        return policy

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read: {exc.strerror}") from exc

    def _parse(self, data: bytes) -> Policy:
        policy = parse_policy(data, str(self.path), self.environ, self.rules)
        why = self.accept(policy) if self.accept is not None else None
        if why:
            raise ConfigError(f"{self.path}: {why}")
        return policy

    def _install(self, policy: Policy, digest: str) -> None:
        self.apply(policy)
        self.sha256 = digest
        self.generation += 1
        self._refused = None
        self.last_error = ""

    def check(self, *, digest_anyway: bool = False) -> bool:
        """One poll: True when a new policy was installed. Never raises. The file is
        read when its stat changed, or with ``digest_anyway`` (the thread does so every
        ``DIGEST_EVERY`` polls: an edit in place within the clock's resolution keeps
        the stat)."""
        with self._lock:
            key = _stat_key(self.path)
            if key is not None and key == self._stat and not digest_anyway:
                return False
            try:
                data = self._read()
            except ConfigError as exc:
                if key is None and self._stat is None:
                    return False  # still missing: said once already
                self._stat = key
                self._refuse("", str(exc))
                return False
            self._stat = key
            digest = hashlib.sha256(data).hexdigest()
            if digest == self.sha256:
                self._refused = None  # back to what serves (e.g. a bad edit undone)
                self.last_error = ""
                return False
            try:
                policy = self._parse(data)
            except ConfigError as exc:
                self._refuse(digest, str(exc))
                return False
            except Exception as exc:  # defence in depth: never stop the reloader
                self._refuse(digest, f"{self.path}: {type(exc).__name__}: {exc}")
                return False
            old = self.sha256
            self._install(policy, digest)
            log.info(f"policy reloaded from {self.path}: generation {self.generation}, "
                     f"sha256 {digest[:DIGEST_SHOWN]}",
                     extra={"fields": {"file": str(self.path), "generation": self.generation,
                                       "sha256": digest[:DIGEST_SHOWN],
                                       "previous": old[:DIGEST_SHOWN]}})
            return True

    def _refuse(self, digest: str, error: str) -> None:
        one_line = " ".join(error.split())[:1000]
        if self._refused == (digest, one_line):
            return
        self._refused = (digest, one_line)
        self.failures += 1
        self.last_error = one_line
        log.warning(f"policy reload refused, still serving generation {self.generation} "
                    f"(sha256 {self.sha256[:DIGEST_SHOWN]}): {one_line}",
                    extra={"fields": {"file": str(self.path), "generation": self.generation}})

    def describe(self) -> str:
        """For ``/readyz``: which policy serves."""
        return f"policy generation {self.generation} sha256 {self.sha256[:DIGEST_SHOWN]}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="envelope-policy-reload",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(self.interval):
            polls += 1
            self.check(digest_anyway=polls % DIGEST_EVERY == 0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class ReloadMetrics:
    """``envelope_policy_generation``, ``envelope_policy_reload_failures_total`` and
    ``envelope_policy_info{sha256}``, read from the reloader at scrape time."""

    def __init__(self, reloader: PolicyReloader, registry: CollectorRegistry) -> None:
        self.reloader = reloader
        registry.register(self)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        r = self.reloader
        generation = GaugeMetricFamily(
            "envelope_policy_generation",
            "Generation of the policy file serving: 1 as read at start, +1 per reload that "
            "changed it")
        generation.add_metric([], float(r.generation))
        failures = CounterMetricFamily(
            "envelope_policy_reload_failures",
            "Policy file contents refused on reload (the previous policy kept serving)")
        failures.add_metric([], float(r.failures))
        info = InfoMetricFamily("envelope_policy",
                                "The policy file serving: its sha256 (first 12 hex digits)")
        info.add_metric([], {"sha256": r.sha256[:DIGEST_SHOWN], "file": str(r.path)})
        yield generation
        yield failures
        yield info
