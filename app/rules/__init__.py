"""The rules, one module per object family, and the registry they join.

Importing a family module registers its rules; this package imports them all.
"""

from app.rules import actors, namespace, quotas, workloads
from app.rules.base import RULES, Finding, Rule, Subject

FAMILIES = (workloads, namespace, quotas, actors)

__all__ = ["FAMILIES", "RULES", "Finding", "Rule", "Subject"]
