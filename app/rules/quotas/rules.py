"""The kai-* rules: each declared once, each a few lines over the package's helpers."""

from __future__ import annotations

from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.crds.kai import (
    SPEC_MODELS,
    ProjectSpec,
    parse,
    project_namespace,
    unknown_fields,
)
from app.k8s.util import brief
from app.rules.base import Finding, Ratchet, Subject, rule, warning
from app.rules.quotas.limits import TREE_CHECKS
from app.rules.quotas.messages import NUMBER_HINT, names_list, plural, quota_error
from app.rules.quotas.names import claimed_by, krm_queue_names
from app.rules.quotas.objects import (
    DEPARTMENT,
    KINDS,
    NODEPOOL,
    POOL,
    PROJECT,
    PROJECT_NAMESPACE,
    PROJECT_PARENT,
    QUEUE,
    QUEUE_PARENT,
    TREES,
    After,
    RuleFn,
    generated_queue,
    krm_owned,
    name_of,
    spec,
    spec_input,
    typed_spec,
)
from app.rules.quotas.shape import (
    deserved_limit_findings,
    structure_krm,
    structure_nodepool,
    structure_queue,
    value_findings,
)
from app.rules.quotas.sums import (
    department_capacity,
    department_shrink,
    nodepool_capacity,
    project_sum,
    queue_shrink,
    queue_sum,
)

#: What every rule that skips KRM-generated Queues reads to tell them (their owner must
#: exist: ``objects.krm_owned``).
OWNERS = frozenset({"Department", "Project"})


def _skip_generated(fn: RuleFn) -> RuleFn:
    """Skip KAI Queues that KRM generates: their Department or Project was judged, and
    the sums would count them twice (a rule using this reads ``OWNERS``). The
    single-object rules (kai-schema, kai-values, kai-deserved-limit) judge every Queue:
    KRM copies a judged entry's numbers, so they hold for its Queue too, and an owner
    claim then switches nothing off."""

    def judged(subject: Subject, obj: dict[str, Any], view: ClusterView, policy: Policy) -> list[Finding]:
        return [] if generated_queue(subject, obj, view) else fn(subject, obj, view, policy)

    judged.__name__, judged.__doc__ = fn.__name__, fn.__doc__
    return judged


@rule("kai-schema", "validate", KINDS, Mode.ENFORCE,
      "quota objects have the CRD's types (numbers are numbers)", judges=spec)
def check_schema(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """The object as the CRD types it; a type error is a finding, never an exception."""
    raw = spec_input(subject.kind, obj)
    model, errors = parse(SPEC_MODELS[(subject.group, subject.kind)], raw)
    findings = []
    for problem in errors:
        text = str(problem)
        if "expected a number, got '" in text:
            text += NUMBER_HINT
        findings.append(quota_error(problem.path, text))
    for path in unknown_fields(model) if model is not None else ():
        findings.append(warning(path, brief(
            f"{path}: unknown field; kubectl apply refuses it, other clients' writes lose it")))
    return findings


@rule("kai-structure", "validate", KINDS, Mode.ENFORCE,
      "known pools and parents, one queue per pool, one NodePool per label pair",
      reads={"NodePool", "Queue", *OWNERS}, judges=spec)
@_skip_generated
def check_structure(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    """Unknown pool or parent, two queues on one pool, a default pool without a queue,
    two NodePools on one label pair, a Queue without resources."""
    after = After(view, subject, obj)
    if subject.kind == "NodePool":
        return structure_nodepool(after, obj)
    if subject.kind == "Queue":
        return structure_queue(after, obj, subject.old if isinstance(subject.old, dict) else None)
    return structure_krm(after, obj)


@rule("kai-values", "validate", TREES, Mode.ENFORCE,
      "no negative quota but -1; overQuotaWeight >= 0; priority a whole number",
      judges=spec, ratchet=Ratchet.DROP)
def check_values(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """No value below 0 but -1; overQuotaWeight never negative; priority a whole number."""
    return value_findings(After(view, subject, obj), obj)


@rule("kai-deserved-limit", "validate", TREES, Mode.ENFORCE,
      "a queue's guarantee is not above its own limit", judges=spec, ratchet=Ratchet.DROP)
def check_deserved_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                         policy: Policy) -> list[Finding]:
    """A guarantee never above its own queue's limit (-1 = unlimited)."""
    return deserved_limit_findings(After(view, subject, obj), obj)


@rule("kai-guarantee-sum", "validate", {PROJECT, QUEUE}, Mode.ENFORCE,
      "children's guarantees fit in their parent's",
      reads={"Department", "Project", "Queue"}, judges=spec)
@_skip_generated
def check_guarantee_sum(subject: Subject, obj: dict[str, Any], view: ClusterView,
                        policy: Policy) -> list[Finding]:
    """Children's guarantees on a pool fit in their parent's (projects in their
    department, KAI queues in their parentQueue)."""
    after = After(view, subject, obj)
    if subject.kind == "Queue":
        return queue_sum(subject, obj, after)
    return project_sum(subject, obj, after)


@rule("kai-shrink", "validate", {DEPARTMENT, QUEUE}, Mode.ENFORCE,
      "a parent is not cut below what its children hold", operations={"UPDATE"},
      reads={"Queue", *OWNERS}, judges=spec)
@_skip_generated
def check_shrink(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """A parent's UPDATE may not cut below what its children already hold, nor drop a
    department queue that projects sit under."""
    after = After(view, subject, obj)
    if subject.kind == "Queue":
        return queue_shrink(subject, obj, after)
    return department_shrink(subject, obj, after)


@rule("kai-pool-capacity", "validate", {DEPARTMENT, NODEPOOL}, Mode.ENFORCE,
      "departments' GPU guarantees fit in the pool's cards",
      reads={"Department", "NodePool", "Node"}, judges=spec)
@_skip_generated
def check_pool_capacity(subject: Subject, obj: dict[str, Any], view: ClusterView,
                        policy: Policy) -> list[Finding]:
    """Departments' GPU guarantees on a pool fit in the cards its nodes have."""
    after = After(view, subject, obj)
    if subject.kind == "NodePool":
        return nodepool_capacity(obj, after) if subject.operation == "CREATE" else []
    return department_capacity(subject, obj, after)


@rule("kai-queue-name-unique", "validate", TREES, Mode.ENFORCE,
      "a queue name is used once across Departments, Projects and KAI Queues",
      reads={"Department", "Project", "Queue"}, judges=spec)
@_skip_generated
def check_queue_names(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """A queue name belongs to one Department or Project (or one unmanaged KAI Queue)."""
    after = After(view, subject, obj)
    if subject.kind != "Queue":
        return krm_queue_names(subject, obj, after)
    if subject.operation != "CREATE":
        return []  # a Queue's name never changes
    other = claimed_by(after, after.name, obj)
    if other is None:
        return []
    return [quota_error("metadata.name",
                    f"queue name {after.name} is already used by {other}; KRM manages that queue. "
                    f"Pick another name")]


@rule("kai-namespace-unique", "validate", {PROJECT}, Mode.ENFORCE, "one Project per namespace",
      reads={"Project"}, judges=spec)
@_skip_generated
def check_namespace(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    """One Project per namespace (``spec.namespace``, else ``kai-<name>``)."""
    spec = typed_spec("Project", obj)
    if not isinstance(spec, ProjectSpec):
        return []
    after = After(view, subject, obj)
    namespace = project_namespace(after.name, spec.namespace)
    old = typed_spec("Project", subject.old) if subject.operation == "UPDATE" else None
    if isinstance(old, ProjectSpec) and project_namespace(after.name, old.namespace) == namespace:
        return []
    others = sorted(name_of(o) for o in after.by_index(PROJECT_NAMESPACE, namespace) if o is not obj)
    if not others:
        return []
    implicit = "" if spec.namespace else f" (the default for a project named {after.name})"
    return [quota_error("spec.namespace",
                    f"namespace {namespace}{implicit} is already claimed by project {others[0]}; "
                    f"KRM would mark this project not ready. Set spec.namespace to a namespace no "
                    f"project uses")]


@rule("kai-tree-warnings", "validate", TREES, Mode.WARN,
      "uncapped project queues, child limits above the parent's, limits above the pool",
      reads={"Department", "Project", "Queue", "NodePool", "Node"}, judges=spec,
      ratchet=Ratchet.DROP)
@_skip_generated
def check_tree(subject: Subject, obj: dict[str, Any], view: ClusterView,
               policy: Policy) -> list[Finding]:
    """Legal but almost always a mistake: a project queue with no department queue
    above it, a child limit above its parent's, a department limit above the pool."""
    return TREE_CHECKS[subject.kind](After(view, subject, obj), obj)


@rule("kai-delete-in-use", "validate", KINDS - {PROJECT}, Mode.WARN,
      "deleting a parent, pool or queue that others still use", operations={"DELETE"},
      reads={"Department", "Project", "Queue"})
def check_delete(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """Deleting what others still point at: a parent department, a pool with queues,
    a queue with children."""
    old = subject.old if isinstance(subject.old, dict) else {}
    if subject.kind == "Queue" and krm_owned(old, view):
        return []
    after = After(view, subject, None)
    name = after.name
    if subject.kind == "Department":
        users = sorted(name_of(o) for o in after.by_index(PROJECT_PARENT, name))
        text = (f"department {name} is still the parent of {plural(len(users), 'project')} "
                f"({names_list(users)}); move them first")
    elif subject.kind == "NodePool":
        departments = after.by_index(POOL["Department"], name)
        projects = after.by_index(POOL["Project"], name)
        users = [name_of(o) for o in departments + projects]
        text = (f"node pool {name} still has queues of {plural(len(departments), 'department')} and "
                f"{plural(len(projects), 'project')}; KRM keeps the pool until they move")
    else:
        users = sorted(name_of(o) for o in after.by_index(QUEUE_PARENT, name))
        text = f"queue {name} still has {plural(len(users), 'child queue')} ({names_list(users)})"
    if not users:
        return []
    return [quota_error("metadata.name", brief(text))]
