"""Workload envelopes: strip CPU limits, keep memory request == limit, on Pods and every
kind that carries a pod template (where each kind keeps it: ``app/k8s/podspec.py``).
Each rule is a pure function ``(subject, obj, view, policy) -> findings``; mutating rules
change ``obj`` (a copy the engine owns) and report what they changed.

One module per idea: ``cpu`` (CPU limits and the opt-out), ``memory`` (memory limits and
requests), ``quantities`` (shape and quantities), ``env_envelope`` (string envelopes in
env), ``updates`` (``COPIERS`` and ``UPDATES``). The package is what
:func:`app.core.ruleset.default_ruleset` collects: its rules in the order they are bound
below (the rule set's order, :func:`app.rules.base.rules_of`). Rule pages: docs/rules/.
"""

from __future__ import annotations

from app.rules.workloads import cpu, env_envelope, memory, quantities, updates

__all__ = ["COPIERS", "CPU_LIMIT_RULES", "UPDATES", "keeps_cpu_limit", "memory_below_limit_applies"]

CPU_LIMIT_RULES = cpu.CPU_LIMIT_RULES
keeps_cpu_limit = cpu.keeps_cpu_limit
memory_below_limit_applies = memory.memory_below_limit_applies
COPIERS = updates.COPIERS
UPDATES = updates.UPDATES

template_opt_outs = cpu.template_opt_outs
strip_cpu_limits = cpu.strip_cpu_limits
fill_memory_limit = memory.fill_memory_limit
memory_below_limit = memory.memory_below_limit
downward_cpu_limit = cpu.downward_cpu_limit
check_resource_quantities = quantities.check_resource_quantities
memory_request_equals_limit = memory.memory_request_equals_limit
strip_cpu_from_env_envelope = env_envelope.strip_cpu_from_env_envelope
env_envelope_consistency = env_envelope.env_envelope_consistency
