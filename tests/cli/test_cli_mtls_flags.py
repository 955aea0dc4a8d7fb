"""``envelope serve --client-ca-file/--client-names``: refused at start when they
cannot work, said on stderr, before anything listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.serve.tls import issue_serving, make_ca, write_self_signed


def _serve(tmp_path: Path, *extra: str) -> list[str]:
    paths = write_self_signed(tmp_path / "tls")
    return ["serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
            "--cert-file", str(paths.cert), "--key-file", str(paths.key),
            "--cluster-view", "none", *extra]


def test_names_without_a_ca_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_serve(tmp_path, "--client-names", "kube-apiserver")) == 2
    assert "--client-names needs --client-ca-file" in capsys.readouterr().err


def test_an_unreadable_or_wrong_ca_file_is_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_serve(tmp_path, "--client-ca-file", str(tmp_path / "missing.crt"))) == 2
    assert "cannot read --client-ca-file" in capsys.readouterr().err
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate")
    assert main(_serve(tmp_path, "--client-ca-file", str(junk))) == 2
    assert "not a PEM certificate bundle" in capsys.readouterr().err
    leaf = tmp_path / "leaf.crt"
    leaf.write_bytes(issue_serving(make_ca(), ["kube-apiserver"]).cert_pem)
    assert main(_serve(tmp_path, "--client-ca-file", str(leaf))) == 2
    assert "is not a CA certificate" in capsys.readouterr().err


def test_env_variables_set_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import _parser

    monkeypatch.setenv("ENVELOPE_CLIENT_CA_FILE", "/etc/ca.crt")
    monkeypatch.setenv("ENVELOPE_CLIENT_NAMES", "kube-apiserver,apiserver-2")
    args = _parser().parse_args(["serve"])
    assert args.client_ca_file == "/etc/ca.crt"
    assert args.client_names == "kube-apiserver,apiserver-2"
