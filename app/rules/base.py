"""What a rule is: a pure function from an object (and what it may read) to findings,
declared once with :func:`rule`.

A rule function is ``fn(subject, obj, view, policy) -> list[Finding]``. It never does
I/O, never reads its own mode (the engine applies modes) and never writes its id: it
returns findings made with :func:`error`, :func:`warning` and :func:`change`, and the
engine stamps them with the id of the rule that returned them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from app.core.config import Mode
from app.k8s.podspec import Held
from app.k8s.util import cut_middle

if TYPE_CHECKING:
    from app.cluster.view import ClusterView
    from app.core.config import Policy

__all__ = ["MESSAGE_LIMIT", "PATH_LIMIT", "Finding", "KindUpdates", "Phase", "Ratchet", "Rule", "Subject",
           "change", "error", "rule", "rules_of", "warning"]

Severity = Literal["error", "warning", "change"]

MESSAGE_LIMIT = 1024
"""Characters a finding's message keeps (the rules' own words take at most a few
hundred). Past it, a value the object holds (a megabyte quantity, a name, a repr) is
cut in the middle, so a review cannot make a denial, a PolicyReport or ``check``'s
output many times its own size (issue 25, class 5)."""
PATH_LIMIT = 512
"""The same for a finding's path (it may hold the object's own keys)."""
Phase = Literal["mutate", "validate"]


@dataclass(slots=True, unsafe_hash=True)
class Finding:
    """One thing a rule says about an object.

    ``error`` denies (in ``enforce`` mode), ``warning`` is shown to the user,
    ``change`` describes a mutation the rule made (the patch carries it).

    Treat it as a value: only the engine writes ``rule``, once, on a finding a rule has
    just returned (not frozen: a frozen dataclass costs 2 µs per finding to build, and
    a mutation yields several per request).
    """

    severity: Severity
    rule: str
    path: str
    message: str
    as_warning: str | None = None
    """What to say instead when the rule runs in ``warn`` mode (an error's text often
    tells the user what to change before a refusal; a warning says what was done)."""

    def __post_init__(self) -> None:
        if len(self.message) > MESSAGE_LIMIT:
            self.message = cut_middle(self.message, MESSAGE_LIMIT)
        if len(self.path) > PATH_LIMIT:
            self.path = cut_middle(self.path, PATH_LIMIT)
        if self.as_warning is not None and len(self.as_warning) > MESSAGE_LIMIT:
            self.as_warning = cut_middle(self.as_warning, MESSAGE_LIMIT)

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "rule": self.rule, "path": self.path,
                "message": self.message}


def error(path: str, message: str, *, as_warning: str | None = None) -> Finding:
    return Finding("error", "", path, message, as_warning)


def warning(path: str, message: str) -> Finding:
    return Finding("warning", "", path, message)


def change(path: str, message: str) -> Finding:
    return Finding("change", "", path, message)


@dataclass(frozen=True, slots=True)
class Subject:
    """The write being judged: the same shape for the webhook and `envelope check`."""

    group: str
    version: str
    kind: str
    operation: str = "CREATE"
    namespace: str = ""
    name: str = ""
    obj: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    dry_run: bool = False
    user: str = ""
    """Who asks (``request.userInfo.username``): for logs only, never for rules."""
    groups: int = 0
    """How many groups the user is in (their names are not logged)."""
    resource_group: str | None = None
    """``request.resource.group`` when it differs from ``group`` (the caller-token check's
    API group; rules judge the kind)."""
    subresource: str = ""
    """``request.subResource``: ``resize`` for a ``pods/resize`` write (the only
    subresource the webhooks match), else empty."""

    @property
    def api_group(self) -> str:
        """The API group of the resource written (``request.resource.group``)."""
        return self.group if self.resource_group is None else self.resource_group

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RuleFn = Callable[["Subject", dict[str, Any], "ClusterView", "Policy"], list[Finding]]
Part = Callable[["Subject", dict[str, Any]], Any]
"""The part of an object a rule judges (see :attr:`Rule.judges`)."""


@dataclass(frozen=True)
class KindUpdates:
    """What one kind's writes hold or leave alone, as the family that judges the kind
    declares it (``UPDATES``, beside ``COPIERS``): the engine applies it and knows no
    kind by name.

    - ``mutate_parts``: in the mutate phase, the part an UPDATE must change for a rule
      judging ``Rule.judges`` to run (a workload's pod template resources and env for
      ``pod_resources``: a patch never rewrites what the UPDATE left as stored);
    - ``held``: what the API server keeps as stored on this UPDATE (a mutating rule's
      change reaching it is undone: a Job's template, a ``pods/resize``'s env);
    - ``owned``: why an object is left as its controller wrote it (a Deployment's
      ReplicaSet), or None.
    """

    mutate_parts: Mapping[Part, Part] = field(default_factory=dict)
    held: Callable[[Subject, dict[str, Any], dict[str, Any] | None, str], Held | None] | None = None
    owned: Callable[[Subject, dict[str, Any] | None], str | None] | None = None



class Ratchet(Enum):
    """What an UPDATE does with a finding the old object already had (same path and
    message: a finding whose numbers changed is new)."""

    NONE = "none"
    """Judge the new object alone."""
    WARN = "warn"
    """Errors become warnings "already so before this update": an unrelated write
    (``kubectl rollout restart``, a label) to an object that predates the policy, or
    that a shrunken cluster no longer fits, is not refused for what it did not change."""
    DROP = "drop"
    """Findings are dropped, as the API server ratchets CRD validation on update."""


@dataclass(frozen=True)
class Rule:
    id: str
    phase: Phase
    kinds: frozenset[tuple[str, str]]
    """(API group, kind) pairs the rule judges."""
    default_mode: Mode
    fn: RuleFn
    summary: str
    operations: frozenset[str] = frozenset({"CREATE", "UPDATE"})
    mutates: bool = True
    """A mutate-phase rule that only reads (a guard) says False: no copy is made for it."""
    order: int = 100
    """Rules of a phase run in this order (guards that others consult run first)."""
    reads: frozenset[str] = frozenset()
    """Kinds the rule reads from the cluster view. The rule is handed a view of these
    kinds only; a stale view of them is answered per the failure mode (enforce) or
    warned about (warn)."""
    judges: Part | None = None
    """On UPDATE, the rule is not run when this part of the old and new object is
    equal (``None`` from it: the whole object is judged)."""
    ratchet: Ratchet = Ratchet.NONE
    holds_back: frozenset[str] = frozenset()
    """Mutating rules not run on an object for which this rule reported an error or a
    warning: a guard that decides the namespace needs CPU limits holds back the rules
    that would remove them."""
    requires: Callable[[Subject, dict[str, Any]], bool] | None = None
    """The rule judges only objects for which this holds (e.g. workload rules need the
    shape Kubernetes gives a pod spec; the ``quantities`` rule reports what is wrong).
    Asked once per object and phase, however many rules share it."""
    announces: bool = False
    """Its changes are also said as warnings (``kubectl`` shows them): a change the user
    would not guess from the manifest, such as a raised memory request."""
    where: Callable[[Subject, ClusterView, Policy], bool] | None = None
    """The rule runs only where the policy chose it to (e.g. ``memoryBelowLimit``'s
    namespaces). Asked by the engine with the whole view, as exemptions are: what it reads
    (Namespaces) is watched only when the policy needs it (``exemptions.needs_namespaces``),
    not on the rule's behalf."""


def rule(id: str, phase: Phase, kinds: Iterable[tuple[str, str]], default: Mode, summary: str,
         *, reads: Iterable[str] = (), operations: Iterable[str] = ("CREATE", "UPDATE"),
         mutates: bool = True, order: int = 100, judges: Part | None = None,
         ratchet: Ratchet = Ratchet.NONE, holds_back: Iterable[str] = (),
         requires: Callable[[Subject, dict[str, Any]], bool] | None = None,
         announces: bool = False,
         where: Callable[[Subject, ClusterView, Policy], bool] | None = None,
         ) -> Callable[[RuleFn], RuleFn]:
    """Declare a rule: the one place its id, kinds, phase, mode and reads are written.

    The declaration is kept on the function (``fn.rule``); :class:`app.core.ruleset.RuleSet`
    collects the declarations of the family modules. Nothing is registered globally.
    """

    def declare(fn: RuleFn) -> RuleFn:
        declared = Rule(id, phase, frozenset(kinds), default, fn, summary, frozenset(operations),
                        mutates, order, frozenset(reads), judges, ratchet, frozenset(holds_back),
                        requires, announces, where)
        vars(fn)["rule"] = declared  # a function's attributes are its __dict__
        return fn

    return declare


def rules_of(namespace: dict[str, Any]) -> list[Rule]:
    """The rules declared among a module's functions, in declaration order."""
    return [value.rule for value in namespace.values()
            if callable(value) and isinstance(getattr(value, "rule", None), Rule)
            and value.rule.fn is value]
