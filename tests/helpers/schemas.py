"""The JSON Schemas of machine output (docs/schemas/), made strict for the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMAS = ROOT / "docs" / "schemas"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with ``additionalProperties: false`` on every object that lists its
    properties: what the outputs print must all be documented."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(strict(schema))
