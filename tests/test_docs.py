"""The documentation names every rule and every setting the code has."""

from pathlib import Path

from app.core.config import ActorSettings, NodeSettings, Policy
from tests.conftest import RULES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_rule_is_documented_with_its_default() -> None:
    text = (DOCS / "configuration.md").read_text()
    for rule in RULES.values():
        assert f"| `{rule.id}` |" in text, rule.id
        row = next(line for line in text.splitlines() if line.startswith(f"| `{rule.id}` |"))
        assert f"| {rule.default_mode.value} |" in row, row


def test_every_setting_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    for model, prefix in ((Policy, ""), (ActorSettings, "actors."), (NodeSettings, "nodes.")):
        for name, field in model.model_fields.items():
            key = field.alias or name
            if key in ("actors", "nodes"):
                continue
            assert f"{prefix}{key}" in text, f"{prefix}{key}"
