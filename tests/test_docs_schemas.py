"""`-o json` of `check` and `audit` against the JSON Schemas in docs/schemas/.

Scripts read these outputs; a change of shape must be a new schemaVersion and a CHANGELOG
entry. Each output is validated against its schema made strict (no property the schema
does not name), so a field added without documenting it fails here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from app.audit import AUDIT_SCHEMA
from app.render.json import CHECK_SCHEMA
from tests.helpers.audit import CPU_LIMIT, GOOD, MEMORY_SPLIT, run
from tests.helpers.cli import envelope
from tests.helpers.schemas import ROOT, SCHEMAS, strict, validator  # noqa: F401


def errors(v: jsonschema.Draft202012Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: a}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: nginx
        resources:
          limits: {cpu: "2", memory: 1Gi}
          requests: {memory: 512Mi}
"""
EXEMPT = DEPLOYMENT.replace("metadata: {name: web, namespace: a}",
                            "metadata: {name: kept, namespace: a, annotations: "
                            "{envelope.io/exempt: cpu-limits}}")


@pytest.mark.parametrize("case", ["examples", "mutated", "exempt", "mixed"])
def test_check_json_follows_its_schema(tmp_path: Path, case: str) -> None:
    (tmp_path / "deploy.yaml").write_text(DEPLOYMENT)
    (tmp_path / "exempt.yaml").write_text(EXEMPT)
    (tmp_path / "notes.txt").write_text("not a manifest\n")
    paths = {"examples": [str(ROOT / "examples")], "mutated": [str(tmp_path / "deploy.yaml")],
             "exempt": [str(tmp_path / "exempt.yaml")], "mixed": [str(tmp_path), str(ROOT / "examples")]}
    out = envelope("check", "-o", "json", *paths[case])
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    assert doc["schemaVersion"] == CHECK_SCHEMA == "check/v1"
    assert errors(validator("check-output.v1.json"), doc) == []
    if case == "mutated":
        assert doc["objects"][0]["changes"] and doc["objects"][0]["patch"]
        assert doc["notEvaluated"]


def test_audit_json_follows_its_schema() -> None:
    found = run([CPU_LIMIT, MEMORY_SPLIT, GOOD])
    doc = json.loads(json.dumps(found.as_json()))
    assert doc["schemaVersion"] == AUDIT_SCHEMA == "audit/v1"
    assert doc["results"] and doc["summary"]
    assert errors(validator("audit-output.v1.json"), doc) == []


def test_the_schema_check_fails_on_a_changed_shape() -> None:
    """Renaming a field or printing an undocumented one is caught."""
    v = validator("audit-output.v1.json")
    doc = run([CPU_LIMIT]).as_json()
    renamed = {**doc, "items": doc.pop("results")}
    assert errors(v, renamed)
    assert errors(v, {**run([CPU_LIMIT]).as_json(), "extra": 1})
    assert errors(v, {**run([CPU_LIMIT]).as_json(), "schemaVersion": "audit/v2"})
