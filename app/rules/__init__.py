"""The rules, one module per object family, and the registry they join."""

from app.rules import workloads as workloads
from app.rules.base import RULES, Finding, Rule, Subject

__all__ = ["RULES", "Finding", "Rule", "Subject"]
