"""The uvicorn server ``envelope serve`` runs, with what uvicorn leaves out:

- SIGHUP drains like SIGTERM (uvicorn handles only SIGINT and SIGTERM, so SIGHUP — a
  closed terminal, a supervisor's hang-up — killed the process at once, cutting the
  reviews in flight, without a log line). Whatever the signal, one log line says which
  signal stops the server and how long in-flight reviews get. After SIGHUP the exit
  status is 0; SIGTERM and SIGINT keep uvicorn's behaviour (re-raised once drained).
- Steps that must wait until the server listens (``after_start``): writing new
  ``--self-signed`` files, so that a start that fails first leaves the files it found.
  A step that fails with an OSError stops the server with exit status 2 and a message
  naming the path.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Generator, Iterable
from types import FrameType

import uvicorn

__all__ = ["Server"]

log = logging.getLogger("envelope")


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config,
                 after_start: Iterable[Callable[[], None]] = ()) -> None:
        super().__init__(config)
        self.after_start = list(after_start)
        self.exit_code = 0
        self.stop_signal: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGHUP, self.handle_exit)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
        if sig == signal.SIGHUP:
            self.should_exit = True  # drain as on SIGTERM; not re-raised, so exit 0
            return
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        for step in self.after_start:
            try:
                step()
            except OSError as exc:
                where = f"cannot write {exc.filename}" if exc.filename else "cannot start"
                print(f"envelope serve: {where}: {exc.strerror or exc}", file=sys.stderr,
                      flush=True)
                self.exit_code = 2
                self.should_exit = True
                return

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.stop_signal is not None:
            name = signal.Signals(self.stop_signal).name
            why = (" (Envelope does not reload on SIGHUP: certificates and the --config "
                   "policy file reload by themselves)" if self.stop_signal == signal.SIGHUP else "")
            (log.warning if self.stop_signal == signal.SIGHUP else log.info)(
                f"stopping on {name}{why}: no new connections, in-flight reviews get up to "
                f"{self.config.timeout_graceful_shutdown} s",
                extra={"fields": {"signal": name,
                                  "connections": len(self.server_state.connections)}})
        await super().shutdown(sockets)
