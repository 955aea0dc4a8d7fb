"""The chart's ``values.schema.json`` knows the rule ids and modes: generated from the
rule set, so ``helm install --set policy.rules.cpu-limit=warn`` (a typo of
``cpu-limits``) is refused by helm at install time, not by a crash-looping pod.

``python -m app.chart.schema`` prints the schema with ``policy.rules`` regenerated;
``--write`` rewrites the file, ``--check`` exits 1 when it is out of date (a unit test
runs the same comparison).

Only two keys of ``policy.rules`` are owned here: ``propertyNames`` (the rule ids)
and the ``enum`` of the mode in ``additionalProperties`` (the :class:`Mode` values).
Everything else in the file, and anything else in ``additionalProperties``, is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.core.config import Mode
from app.core.ruleset import RuleSet, default_ruleset

__all__ = ["SCHEMA", "render", "stale", "with_rules"]

SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "envelope" / "values.schema.json"


def with_rules(schema: dict[str, Any], rules: RuleSet) -> dict[str, Any]:
    """``schema`` with ``policy.rules`` naming exactly the ids of ``rules`` and the modes."""
    out: dict[str, Any] = json.loads(json.dumps(schema))
    section = out["properties"]["policy"]["properties"]["rules"]
    section["propertyNames"] = {"enum": sorted(rules)}
    value = section.setdefault("additionalProperties", {"type": "string"})
    value["enum"] = [m.value for m in Mode]
    return out


def render(schema: dict[str, Any]) -> str:
    """The file's formatting: two-space indent, non-ASCII kept (UTF-8), a final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def stale(text: str, rules: RuleSet) -> bool:
    """Whether the file's rule ids or modes differ from ``rules`` (compared as data, so
    formatting is free)."""
    current: dict[str, Any] = json.loads(text)
    return current != with_rules(current, rules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.chart.schema", description=__doc__)
    parser.add_argument("--file", type=Path, default=SCHEMA)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the file")
    action.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    current = args.file.read_text()
    rules = default_ruleset()
    wanted = render(with_rules(json.loads(current), rules))
    if args.check:
        if stale(current, rules):
            print(f"{args.file} is out of date: run python -m app.chart.schema --write",
                  file=sys.stderr)
            return 1
        return 0
    if args.write:
        args.file.write_text(wanted)
        return 0
    sys.stdout.write(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
