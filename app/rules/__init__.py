"""The rules, one module or package per object family: ``workloads`` (CPU limits and
memory envelopes), ``namespace`` (workload rules that read the namespace and the nodes:
CPU-limit guards, pod-fits-node, namespace memory), ``quotas`` (KAI quota trees) and
``actors`` (agent-substrate sandboxes).

Each declares its rules with :func:`app.rules.base.rule`; :mod:`app.core.ruleset` collects
them. Importing this package registers nothing.
"""
