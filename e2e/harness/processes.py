"""Child processes that never outlive the tests: process groups, a parent-death signal,
and cleanup on exit and on SIGINT/SIGTERM."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

_LIVE: dict[int, ManagedProcess] = {}
_LIVE_LOCK = threading.RLock()  # re-entrant: also taken in signal handlers
_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS: dict[int, Any] = {}


# Loaded up front: the preexec hook below runs between fork and exec, where
# importing or loading libraries is not safe.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:  # runs in the child, before exec
    """Linux: have the kernel SIGKILL the child if the test process dies hard."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class ManagedProcess:
    """A child process running in its own process group, logging to a file."""

    name: str
    cmd: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``timeout``."""
        try:
            _signal_group(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
            # Also kill anything the leader left behind in its group.
            _signal_group(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            with _LIVE_LOCK:
                _LIVE.pop(self.popen.pid, None)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_all_processes() -> None:
    """Stop every process started by start_process that is still registered."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in reversed(procs):
        with contextlib.suppress(Exception):
            proc.stop(timeout=5)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all_processes()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # Default action: restore it and re-deliver, so the exit status is right.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all_processes)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)


def start_process(
    cmd: Sequence[str | os.PathLike[str]],
    log_path: Path,
    *,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start ``cmd`` in a new process group, stdout+stderr appended to ``log_path``.

    The process is stopped (whole group) by ``ManagedProcess.stop()``, and in
    any case at interpreter exit, on SIGTERM/SIGHUP, and (Linux) by the kernel
    if this process is killed outright.
    """
    _install_cleanup_handlers()
    argv = [os.fspath(c) for c in cmd]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("ab")
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal,
        )
    except BaseException:
        log_file.close()
        raise
    proc = ManagedProcess(
        name=name or Path(argv[0]).name,
        cmd=argv,
        log_path=log_path,
        popen=popen,
        _log_file=log_file,
    )
    with _LIVE_LOCK:
        _LIVE[popen.pid] = proc
    return proc


def stop_process(proc: ManagedProcess, timeout: float = 15.0) -> None:
    """Stop ``proc`` and its whole process group (see ManagedProcess.stop)."""
    proc.stop(timeout=timeout)




@dataclass
class Component:
    """A control-plane component the harness started (kube-scheduler,
    kube-controller-manager): its process and the port it serves on."""

    process: ManagedProcess
    port: int

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def stop(self) -> None:
        self.process.stop(timeout=10)
