"""Names with control characters in every output of the offline tools (issue 38, class
7): no name drives the terminal (ESC sequences), and none starts a line of its own —
a newline in a name forged a GitHub workflow command (``::error …``) in check's default
text output. JSON and SARIF are escaped by their encoder, JUnit must stay valid XML,
and fix and krm-fn messages show the escapes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from app.core.config import load_policy
from app.fix.krmfn import process
from app.k8s.util import visible
from tests.conftest import RULES
from tests.helpers.cli import envelope

POLICY = load_policy(None, None, RULES)

NAME = "web\n::error file=x,line=1::forged\x1b[31mred\x9b\x85\u2028end\r"
"""A name with a newline starting a workflow command, an ESC sequence, 8-bit CSI, NEL,
LINE SEPARATOR and CR."""

MANIFEST = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": "team-a"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}}}
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters but tab and newline (which the outputs use themselves)."""


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "names.yaml"
    path.write_text(json.dumps(MANIFEST))  # JSON is YAML: the name's escapes are the parser's
    return path


def _lines_are_ours(out: str) -> None:
    assert not RAW.search(out), RAW.findall(out)
    for line in out.splitlines():
        assert not line.startswith("::error file=x"), line


def test_visible_escapes_every_control_character_and_nothing_else() -> None:
    assert visible(NAME) == ("web\\n::error file=x,line=1::forged\\x1b[31mred\\x9b\\x85\\u2028end\\r")
    assert visible("café ✓ \t") == "café ✓ \\t"
    assert visible("a\nb", keep="\n") == "a\nb"


@pytest.mark.parametrize("output", ["text", "github"])
def test_text_and_github_outputs_escape_names(tmp_path: Path, output: str) -> None:
    done = envelope("check", "-o", output, str(_write(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "forged" in done.stdout
    _lines_are_ours(done.stdout)
    _lines_are_ours(done.stderr)


@pytest.mark.parametrize("output", ["json", "sarif"])
def test_json_and_sarif_keep_the_name_exactly_through_their_encoder(tmp_path: Path, output: str) -> None:
    done = envelope("check", "-o", output, str(_write(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "\n::error" not in done.stdout and "\x1b" not in done.stdout

    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert any(NAME in s for s in strings(json.loads(done.stdout)))


def test_junit_is_valid_xml_and_shows_the_escapes(tmp_path: Path) -> None:
    done = envelope("check", "-o", "junit", str(_write(tmp_path)))
    assert done.returncode == 0, done.stderr
    root = ET.fromstring(done.stdout)  # before: "not well-formed (invalid token)"
    [case] = root.iter("testcase")
    assert case.get("name") == f"Deployment team-a/{visible(NAME)}"


def test_input_errors_and_fix_messages_escape_paths_and_names(tmp_path: Path) -> None:
    bad = tmp_path / "bad\x1b[2Jname\n::error::x.yaml"
    bad.write_text("kind: [\n")
    for command in (["check"], ["check", "-o", "github"], ["fix"]):
        done = envelope(*command, str(bad))
        assert done.returncode == 2
        _lines_are_ours(done.stdout)
        _lines_are_ours(done.stderr)
        assert "bad\\x1b[2Jname" in done.stderr


def test_krm_fn_messages_escape_names() -> None:
    resource_list = yaml.safe_dump({"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList",
                                    "items": [MANIFEST]})
    text, _ = process(resource_list, RULES, POLICY)
    results = yaml.safe_load(text)["results"]
    assert results and all(not RAW.search(r["message"]) for r in results)
    assert results[0]["resourceRef"]["name"] == NAME  # the reference stays exact (data, not text)
