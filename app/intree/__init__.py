"""In-tree admission: Envelope's single-object rules compiled to the API server's own
``admissionregistration.k8s.io/v1`` MutatingAdmissionPolicies (issue 22), with the
webhook left for what needs the rest of the cluster.

- :mod:`app.intree.compile`: from the rule set and the policy, the policies and their
  bindings, the CEL *domain* (the writes they answer exactly as ``/mutate`` would) and
  the reduced mutating webhook's matchConditions (what is left to the webhook);
- :mod:`app.intree.facts`: the per-namespace fact the binding selects on instead of the
  LimitRanges and ResourceQuotas a policy cannot see (a Namespace label), kept current
  outside the admission path by :class:`~app.intree.facts.ViewFactKeeper` in the Lease
  holder of ``envelope serve --in-tree-facts`` (or by hand: ``python -m app.intree.facts``);
- :mod:`app.intree.chartfile`: the chart's copy of the policy (files/intree.yaml).

What is compiled, what is not and why: docs/in-tree.md.
"""

from app.intree.compile import (
    FACT_LABEL,
    FACT_VALUE,
    Compiled,
    NotCompilable,
    compile_in_tree,
)

__all__ = ["FACT_LABEL", "FACT_VALUE", "Compiled", "NotCompilable", "compile_in_tree"]
