"""``envelope serve`` start-up and signals, through the real entry point in a subprocess:
a kubeconfig that was asked for must load, ``auto`` without any cluster says so, SIGHUP
drains the review in flight, and a failed start leaves the certificate files it found."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.serve.tls import make_ca, save_self_signed, write_self_signed

ROOT = Path(__file__).resolve().parents[2]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """No cluster anywhere: no KUBECONFIG, not in a pod, an empty HOME."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
           and not k.startswith("ENVELOPE_")}
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


def serve(tmp: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """A start that is expected to end by itself (a refusal): on the old code some of
    these served forever, which the timeout turns into a failure."""
    return subprocess.run([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1",
                           "--port", "0", "--metrics-port", "0", *args],
                          env=env or clean_env(tmp / "home"), cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def digest(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# -- a kubeconfig asked for must load ---------------------------------------------------

@pytest.mark.parametrize("text", ["garbage: [\n", "apiVersion: v1\nkind: Config\n"
                                  "clusters: []\ncontexts: []\n"])
def test_a_garbage_kubeconfig_refuses_to_start_naming_the_file(tmp_path: Path, text: str) -> None:
    """Before: ``--cluster-view auto`` (the default) logged a warning and served an empty
    cluster, so every quota and LimitRange check allowed what the policy refuses."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    for how in ("flag", "env"):
        args = ["--self-signed", "--self-signed-dir", str(tmp_path / "certs")]
        env = clean_env(tmp_path / "home")
        if how == "flag":
            args += ["--kubeconfig", str(kubeconfig)]
        else:
            env["KUBECONFIG"] = str(kubeconfig)
        out = serve(tmp_path, *args, env=env)
        assert out.returncode == 2, (how, out.stderr[-2000:])
        assert f"cannot load kubeconfig (--kubeconfig / KUBECONFIG) {kubeconfig}" in out.stderr
        assert "refusing to start" in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "certs").exists()  # nothing written by a start that failed


def test_a_missing_kubeconfig_refuses_to_start(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config"
    out = serve(tmp_path, "--self-signed", "--self-signed-dir", str(tmp_path / "c"),
                "--kubeconfig", str(missing))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"cannot load kubeconfig (--kubeconfig / KUBECONFIG) {missing}: no such file" \
        in out.stderr


def test_a_broken_default_kubeconfig_also_refuses(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{not yaml")
    out = serve(tmp_path, "--self-signed", "--self-signed-dir", str(tmp_path / "c"),
                env=clean_env(home))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"cannot load kubeconfig {home / '.kube' / 'config'}" in out.stderr


def test_live_without_any_cluster_refuses_and_says_where_it_looked(tmp_path: Path) -> None:
    out = serve(tmp_path, "--self-signed", "--self-signed-dir", str(tmp_path / "c"),
                "--cluster-view", "live")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--cluster-view live needs a cluster configuration: no --kubeconfig or KUBECONFIG " \
           "given, not in a pod" in out.stderr


# -- a running server: auto with no cluster, SIGHUP ---------------------------------------

class Running:
    def __init__(self, tmp: Path, certs: Path, *args: str) -> None:
        self.port = free_port()
        self.log = tmp / "serve.log"
        self.certs = certs
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--self-signed", "--self-signed-dir",
             str(certs), "--host", "127.0.0.1", "--port", str(self.port), "--metrics-port", "0",
             *args], env=clean_env(tmp / "home"), cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()
                if line.startswith("{")]

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        ctx.check_hostname = False
        return ctx

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if (self.certs / "ca.crt").exists():
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=2) as raw, \
                            self.context().wrap_socket(raw) as tls:
                        tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        if tls.recv(100).startswith(b"HTTP/1.1 200"):
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise AssertionError("not ready:\n" + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for r in made:
        r.stop()


def review(uid: str) -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {
               "limits": {"cpu": "1", "memory": "64Mi"}, "requests": {"memory": "64Mi"}}}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "kind": {"group": "", "version": "v1",
                                                        "kind": "Pod"},
                                   "resource": {"group": "", "version": "v1",
                                                "resource": "pods"},
                                   "operation": "CREATE", "namespace": "team-a",
                                   "object": pod}}).encode()


def read_response(tls: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_sighup_drains_the_review_in_flight_says_why_and_exits_0(
        tmp_path: Path, running: list[Running]) -> None:
    """Before: SIGHUP (not handled by uvicorn) killed the process at once: the review
    whose body was still arriving got no answer, and nothing was logged."""
    certs = tmp_path / "certs"
    before = write_self_signed(certs)  # a usable pair is found, kept and served
    found = digest(certs)
    server = Running(tmp_path, certs)
    running.append(server)
    server.wait_ready()
    assert digest(certs) == found, "a usable pair was replaced at start"
    body = review("sighup-in-flight")
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    with server.context().wrap_socket(raw) as tls:
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:40])
        time.sleep(0.5)  # headers and part of the body are in: the review is in flight
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not any(line.get("signal") == "SIGHUP" for line in server.lines()):
            assert server.proc.poll() is None, \
                f"died on SIGHUP (rc {server.proc.returncode}):\n{server.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.05)
        tls.sendall(body[40:])
        status, answer = read_response(tls)
    assert status == 200, answer
    assert json.loads(answer)["response"]["uid"] == "sighup-in-flight"
    assert server.proc.wait(30) == 0
    [line] = [line for line in server.lines() if line.get("signal") == "SIGHUP"]
    assert line["level"] == "warning" and line["msg"].startswith("stopping on SIGHUP")
    assert "in-flight reviews get up to 10 s" in line["msg"]
    assert (certs / "ca.crt").read_bytes() == before.ca.read_bytes()


def test_auto_with_no_cluster_anywhere_says_so_in_a_warning(
        tmp_path: Path, running: list[Running]) -> None:
    server = Running(tmp_path, tmp_path / "certs")
    running.append(server)
    server.wait_ready()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    [warning] = [line for line in server.lines() if line.get("clusterView") == "none"]
    assert warning["level"] == "warning" and "EMPTY cluster" in warning["msg"]
    assert "no --kubeconfig or KUBECONFIG given, not in a pod" in warning["reason"]
    assert any(line.get("signal") == "SIGTERM" and line["msg"].startswith("stopping on SIGTERM")
               for line in server.lines())


def test_the_start_line_names_the_serving_versions_and_they_are_the_locked_ones(
        tmp_path: Path, running: list[Running]) -> None:
    """A log says whether what runs is what ships: uvicorn (whose internals
    app/serve/httplimits.py subclasses) at the version requirements.lock pins (issue 35: ``make
    run`` had installed uvicorn 0.55.0 while the lock and the image pinned 0.54.0)."""
    import re

    server = Running(tmp_path, tmp_path / "certs")
    running.append(server)
    server.wait_ready()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    [start] = [line for line in server.lines() if line["msg"].startswith("starting envelope")]
    lock = (ROOT / "requirements.lock").read_text()
    for name in ("uvicorn", "uvloop", "httptools", "fastapi", "starlette"):
        [pinned] = re.findall(rf"(?m)^{name}==([^ ;\\]+)", lock)
        assert start["versions"][name] == pinned, (name, start["versions"], pinned)
        assert f"{name} {pinned}" in start["msg"]


# -- a failed start leaves the certificate files -----------------------------------------

def unusable_pair(directory: Path) -> dict[str, bytes]:
    """A pair --self-signed will not reuse (the certificate is not the CA's): a start
    replaces it, but only a start that got as far as listening."""
    write_self_signed(directory)
    (directory / "ca.crt").write_bytes(make_ca().cert_pem)
    return digest(directory)


def test_a_start_that_fails_after_the_certificates_leaves_the_files_it_found(
        tmp_path: Path) -> None:
    """Before: --self-signed wrote a new CA and pair first, and the start then failed
    (here: --cluster-view live with no cluster): the files found were gone."""
    for name, make in (("usable", lambda d: (write_self_signed(d), digest(d))[1]),
                       ("unusable", unusable_pair)):
        certs = tmp_path / name
        found = make(certs)
        out = serve(tmp_path, "--self-signed", "--self-signed-dir", str(certs),
                    "--cluster-view", "live")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert digest(certs) == found, name


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 12 KiB tmpfs: three small files fill it (a full disk, for real)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_names_the_path_exits_2_and_keeps_the_files(
        tmp_path: Path, tiny_fs: Path) -> None:
    certs = tiny_fs / "certs"
    found = unusable_pair(certs)  # fills the tmpfs: no room for the new pair
    out = serve(tmp_path, "--self-signed", "--self-signed-dir", str(certs))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert f"envelope serve: cannot write {certs / 'ca.crt'}: No space left on device" \
        in out.stderr, out.stderr[-2000:]
    assert digest(certs) == found  # the files found, intact; no temporary files left


def test_save_is_all_or_none_on_a_full_disk(tiny_fs: Path) -> None:
    certs = tiny_fs / "c"
    found = unusable_pair(certs)
    ca = make_ca()
    with pytest.raises(OSError) as raised:
        save_self_signed(certs, ca, ca)
    assert raised.value.filename == str(certs / "ca.crt")
    assert digest(certs) == found


def test_an_overlap_shorter_than_four_reload_intervals_is_refused(tmp_path: Path) -> None:
    out = serve(tmp_path, "--tls-mode", "self", "--namespace", "ns", "--service-name", "svc",
                "--tls-interval", "5", "--ca-overlap-seconds", "19")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--ca-overlap-seconds 19 is shorter than 4x --tls-interval (20 s)" in out.stderr
