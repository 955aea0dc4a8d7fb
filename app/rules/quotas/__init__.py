"""Quota trees: KAI Resource Management (NodePool, Department, Project) and KAI Queues.

The arithmetic of a quota tree (children's guarantees fit their parent's, a guarantee is
not above its own limit, -1 means unlimited, node pools hold the cards promised on them,
names are cluster-wide) plus KRM's own structural checks, so that ``envelope check``
catches offline what the cluster would refuse. Every rule is a pure function of the
write and of :class:`~app.rules.quotas.objects.After` (the view as the write would leave
it), and reads siblings, names and pools through indexes, never a whole kind. How a write
is judged (what an UPDATE is judged on, which sums deny, the ratchet): docs/quotas.md,
"How a write is judged".

Modules, in the order a reader needs them: ``objects`` (raw fields, indexes, ``After``),
``tree`` (queues as numbers, pool capacity), ``messages`` (wording), ``shape`` (one
object alone), ``sums`` (parents and children), ``names`` (cluster-wide names),
``limits`` (tree warnings) and ``rules`` (the declarations); ``usage`` declares its own
rules: quota changes against KAI Queue status (what the queues hold right now).
"""
