"""Quota trees: KAI Resource Management (NodePool, Department, Project) and KAI Queues.

The arithmetic of a quota tree (children's guarantees fit their parent's, a guarantee
is not above its own limit, -1 means unlimited, node pools hold the cards promised on
them, names are cluster-wide) plus KRM's own structural checks, so that
``envelope check`` catches offline what the cluster would refuse. Every rule is a pure
function of the write and of :class:`~app.rules.quotas.objects.After` — the view as the
write would leave it. Nothing lists a whole kind on the admission path: siblings, names
and pools are read through indexes, so a request costs the same in a cluster of 10
Projects or 10,000.

A write is judged on what it changes:

- an UPDATE that leaves ``spec`` alone (finalizers, labels, status) is not judged
  (every rule declares ``judges=spec``);
- the sums deny only a write that grows a guarantee (or shrinks a cap) into an excess:
  a project that shrinks while its department is still over-promised is let through,
  because refusing it would block the very fix;
- the per-object rules drop, on UPDATE, findings the old object already had, as the
  API server ratchets CRD validation (``ratchet=Ratchet.DROP``; a finding whose
  numbers changed is new).

``envelope check`` and an audit judge every object as a CREATE, so they report
everything, once per object involved.

Modules, in the order a reader needs them: ``objects`` (raw fields, indexes,
``After``), ``tree`` (queues as numbers, pool capacity), ``messages`` (wording),
``shape`` (one object alone), ``sums`` (parents and children), ``names``
(cluster-wide names), ``limits`` (tree warnings) and ``rules`` (the declarations);
``usage`` declares its own rules: quota changes against KAI Queue status (what the
queues hold right now).
"""
