"""The rule reference: a page per rule, generated from its declaration (``@rule``: id,
summary, phase, kinds, modes, reads) and its entry in ``app/ruledocs/data/<id>.yaml``
(what, why, the fix, and an example that fails and its fixed version).

The examples are run, not quoted: a page shows what the engine answers to its failing
manifest and to the fixed one (``core.frontdoor.FrontDoor`` over a ``StaticView`` of the
example's objects, as ``envelope check`` judges files), so a page whose example stops
failing, or whose fix stops passing, no longer matches what ``python -m app.ruledocs``
writes, and ``tests/ruledocs/test_ruledocs.py`` fails.

Used by ``envelope rules`` and ``envelope explain`` (app/cli/reference.py), by the SARIF renderer
(``helpUri`` and the per-family hint, app/render/reports.py), and by ``python -m app.ruledocs
[DIR]``, which writes ``docs/rules/<id>.md`` and ``docs/rules/README.md``.

Why one module of ~410 lines: a rule's page, its SARIF help and its hint are read from the
same declaration and data file, and share the texts (families, modes, ratchets, hints);
the examples are run here so that a page never says what the engine does not answer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from app.cluster.static import Loaded, load_text
from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.frontdoor import DEFAULT_NAMESPACE, FrontDoor, placed
from app.core.ruleset import NEEDS, RuleSet
from app.rules.base import Finding, Rule

__all__ = ["DOCS_URL_ENV", "Example", "RuleDoc", "Run", "docs_url", "family", "help_for",
           "help_uri", "hint", "index_page", "load_doc", "page", "pages", "rule_page_names",
           "run_example", "write_pages"]

DOCS_URL_ENV = "ENVELOPE_DOCS_URL"
"""Where the rule pages are published, ending in ``/``: SARIF's ``helpUri`` is this plus
``rules/<id>.md``. Unset, it is the path of the pages in Envelope's repository
(``docs/rules/<id>.md``), relative: set it to your copy of the docs (a Git host's URL of
``docs/`` at the version you run) for links code-scanning viewers can open."""
DEFAULT_DOCS_URL = "docs/"

FAMILIES = {"app.rules.workloads": "workloads", "app.rules.namespace": "workloads",
            "app.rules.quotas": "quotas", "app.rules.actors": "actors",
            "app.rules.exceptions": "exceptions"}
"""Family of a rule, by the module that declares it (docs/configuration.md's column)."""

FAMILY_TEXT = {
    "workloads": "Pod specs of every workload kind (Pod, Deployment, StatefulSet, DaemonSet, "
                 "ReplicaSet, ReplicationController, Job, CronJob)",
    "quotas": "KAI Resource Management and KAI Scheduler quota trees "
              "(NodePool, Department, Project, Queue); see [quotas.md](../quotas.md)",
    "actors": "agent-substrate actor sandboxes (ActorTemplate, WorkerPool); see "
              "[actors.md](../actors.md)",
    "exceptions": "Envelope's delegated exceptions (EnvelopeException); see "
                  "[configuration.md](../configuration.md#delegated-exceptions)",
}

CPU_LIMIT_RULES = frozenset({"cpu-limits", "env-envelope-cpu", "quota-needs-cpu-limits", "template-opt-outs",
                             "limitrange-needs-cpu-limits", "downward-cpu-limit"})
"""Rules the ``keep-cpu-limit`` opt-out is about: it is their hint, and no other's."""

FAMILY_HINTS = {
    "workloads": ("An object is exempt when a policy `exceptions` entry matches it (namespaces, "
                  "namespaceSelector, objectSelector, kinds) or, with `allowObjectExemptions`, "
                  "when its annotation `envelope.io/exempt` names the rule."),
    "quotas": ("Quota objects are cluster-scoped and judged against the whole tree: fix the "
               "numbers in the tenancy (docs/quotas.md), in the order the message gives; "
               "`envelope check -f` on the tenancy directory shows every object that holds "
               "part of a sum. They have no namespace, so only an `exceptions` entry by kinds "
               "or objectSelector, or their `envelope.io/exempt` annotation, exempts them."),
    "actors": ("ActorTemplates are sized by `spec.resources.limits` alone and placed on the "
               "WorkerPools of their `sandboxClass` in their namespace (docs/actors.md); "
               "`kubectl get workerpools -n NAMESPACE -o yaml` shows what a template can land "
               "on. A policy `exceptions` entry or the `envelope.io/exempt` annotation exempts "
               "an object."),
    "exceptions": ("What namespace owners may except is the cluster policy's "
                   "`delegatedExceptions` (`allowedRules`, `namespaces`, `namespaceSelector`); "
                   "an EnvelopeException is never exempt itself."),
}
CPU_LIMIT_HINT = ('The annotation `envelope.io/keep-cpu-limit: "true"` (`optOutAnnotation`) on a '
                  "workload or its pod template keeps its CPU limits, in every mode.")


def family(rule: Rule) -> str:
    module = rule.fn.__module__
    for prefix, name in FAMILIES.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    raise LookupError(f"rule {rule.id}: no family for module {module}")


def hint(rule: Any) -> str:
    """What a user who meets this rule can do besides fixing the object: the right one for
    its family (the ``keep-cpu-limit`` opt-out only for the CPU-limit rules)."""
    fam = family(rule) if isinstance(rule, Rule) else "workloads"
    text = FAMILY_HINTS[fam]
    if rule.id in CPU_LIMIT_RULES:
        text = f"{CPU_LIMIT_HINT} {text}"
    return text


def docs_url(environ: dict[str, str] | None = None) -> str:
    base = (os.environ if environ is None else environ).get(DOCS_URL_ENV) or DEFAULT_DOCS_URL
    return base if base.endswith("/") else base + "/"


def help_uri(rule_id: str, environ: dict[str, str] | None = None) -> str:
    return f"{docs_url(environ)}rules/{rule_id}.md"


def help_for(rule: Any) -> dict[str, str]:
    """SARIF ``help`` (text and markdown) for a rule: summary, default mode, how to set its
    mode, its family's hint and where its page is."""
    mode = getattr(getattr(rule, "default_mode", None), "value", None)
    default = f" Its default mode is {mode}." if mode else ""
    doc = load_doc(rule.id) if rule.id in rule_page_names() else None
    what = f" {' '.join(doc.what.split())}" if doc else ""
    fix = f"\n\nFix: {' '.join(doc.fix.split())}" if doc and doc.fix else ""
    modes = (f"Set its mode in the policy file (`rules: {{{rule.id}: enforce|warn|off}}`, "
             f"see docs/configuration.md). {hint(rule)}")
    uri = help_uri(rule.id)
    summary = rule.summary[:1].upper() + rule.summary[1:]
    text = (f"{summary}.{default}{what}{fix}\n\n{modes}\n\nReference: {uri} "
            f"(or `envelope explain {rule.id}`)")
    markdown = (f"**{summary}.**{default}{what}{fix}\n\n{modes}\n\n"
                f"[Rule reference]({uri}) · `envelope explain {rule.id}`")
    return {"text": text, "markdown": markdown, "uri": uri}


# --- the data ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Example:
    failing: str
    """The write that fails: one YAML document (the object written)."""
    fixed: str
    """The same write, fixed."""
    expect: str = "error"
    """What the rule says about ``failing``: ``error``, ``warning`` or ``change``."""
    operation: str = "CREATE"
    cluster: str = ""
    """Objects already there (YAML documents): Nodes, LimitRanges, quotas, pools."""
    old: str = ""
    """For UPDATE and DELETE: the object as stored before the write."""
    policy: dict[str, Any] = field(default_factory=dict)
    """Policy file settings the example runs with (``{}``: the defaults)."""


@dataclass(frozen=True)
class RuleDoc:
    id: str
    what: str
    why: str
    fix: str
    example: Example


def _data_dir() -> Any:
    return files("app.ruledocs").joinpath("data")


@functools.cache
def rule_page_names() -> frozenset[str]:
    return frozenset(p.name[:-5] for p in _data_dir().iterdir() if p.name.endswith(".yaml"))


@functools.cache
def load_doc(rule_id: str) -> RuleDoc:
    raw = yaml.safe_load(_data_dir().joinpath(f"{rule_id}.yaml").read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"app/ruledocs/data/{rule_id}.yaml: expected a mapping")
    unknown = set(raw) - {"what", "why", "fix", "example"}
    if unknown:
        raise ValueError(f"app/ruledocs/data/{rule_id}.yaml: unknown keys {sorted(unknown)}")
    ex = dict(raw["example"])
    return RuleDoc(rule_id, raw["what"], raw["why"], raw.get("fix", ""), Example(**ex))


# --- running the examples ---------------------------------------------------------------

def _objects(text: str, source: str) -> list[dict[str, Any]]:
    if not text.strip():
        return []
    out = Loaded()
    load_text(text, source, out)
    if out.errors:
        raise ValueError("; ".join(str(e) for e in out.errors))
    return [m.obj for m in out.manifests]


@dataclass(frozen=True)
class Run:
    findings: list[Finding]
    """Errors and warnings about the written object, then the changes the webhook makes."""
    internal: list[str]

    def lines(self) -> list[str]:
        """As `envelope check` prints them under the object."""
        out = [f"{f.severity:<7} {f.rule}: {f.message}" for f in self.findings
               if f.severity != "change"]
        out += [f"change  {f.message}" for f in self.findings if f.severity == "change"]
        out += [f"error   internal: {e}" for e in self.internal]
        return out

    def by(self, rule_id: str) -> set[str]:
        return {f.severity for f in self.findings if f.rule == rule_id}


def run_example(rules: RuleSet, example: Example, which: str) -> Run:
    """What the webhook pair (mutate, then validate) answers to the example's ``failing``
    or ``fixed`` write, with the example's cluster objects (and the old object) in view."""
    cluster = _objects(example.cluster, "cluster")
    old = _objects(example.old, "old")
    written = _objects(getattr(example, which), which)
    if len(written) != 1 or len(old) > 1:
        raise ValueError(f"example {which}: expected one object written, one old object at most")
    obj = written[0]
    operation = example.operation
    before = old[0] if old else None
    # As `envelope check` reads files: the view holds every object of the input (one
    # written without a namespace in `default`); a write to a stored object (UPDATE,
    # DELETE) finds the stored one there.
    stored = [before or obj] if operation != "CREATE" else [obj]
    objects = [placed(o, DEFAULT_NAMESPACE) for o in (*cluster, *stored)]
    policy = Policy.model_validate(example.policy) if example.policy else Policy()
    door = FrontDoor(rules, StaticView(objects, rules.indexes), policy, objects=objects)
    result = door.judge(None if operation == "DELETE" else obj, operation=operation,
                        old=obj if operation == "DELETE" else before).evaluation
    return Run([*result.findings, *result.changes], [str(e) for e in result.internal_errors])


# --- pages ------------------------------------------------------------------------------

MODE_TEXT = {
    ("validate", "enforce"): "an error denies the write (`kubectl` prints it with the rule id); "
                             "`envelope check` exits 1",
    ("validate", "warn"): "the write is admitted; the error is returned as a warning "
                          "(`kubectl` prints `Warning: ...`)",
    ("mutate", "enforce"): "the object is changed (the patch carries the change); a guard's "
                           "error denies",
    ("mutate", "warn"): "nothing is changed or denied; what would have been is returned as a "
                        "warning",
}

RATCHET_TEXT = {
    "none": "judged as a new object",
    "warn": "an error the old object already had becomes a warning (\"already so before this "
            "update: ...\"), so unrelated writes to objects that predate the policy pass",
    "drop": "a finding the old object already had is dropped, as the API server ratchets CRD "
            "validation",
}


def _kinds(kinds: Iterable[tuple[str, str]]) -> str:
    ordered = sorted(kinds, key=lambda gk: (gk[1], gk[0]))
    return ", ".join(f"`{k}`" + (f" ({g})" if g else "") for g, k in ordered)


def _needs(rule: Rule) -> tuple[str, ...]:
    return tuple(getattr(rule, "needs", None) or NEEDS.get(rule.id, ()))


def _yaml_block(text: str) -> str:
    return f"```yaml\n{text.strip()}\n```"


def _answer(run: Run, rule_id: str) -> str:
    lines = run.lines()
    if not lines:
        return "Envelope answers nothing: the write is admitted as it is."
    note = "" if run.by(rule_id) else f" (nothing from `{rule_id}`)"
    return f"Envelope answers{note}:\n\n```\n" + "\n".join(lines) + "\n```"


EXPECT_TEXT = {
    "error": ("**Fails** (an error: denied in `enforce` mode)", "**Fixed**"),
    "warning": ("**Warned** (a warning: admitted, with the warning)", "**Fixed**"),
    "change": ("**Changed** (the mutating webhook rewrites it)", "**Left as written**"),
}


def _operation_text(example: Example, kind: str) -> str:
    if example.operation == "UPDATE":
        return f", as an UPDATE of the stored {kind}"
    if example.operation == "DELETE":
        return f", as a DELETE of this {kind}"
    return ""


def _facts(rule: Rule) -> str:
    """The table at the top of a rule's page: its family, phase, mode, kinds and reads."""
    fam = family(rule)
    mode = rule.default_mode.value
    reads = ", ".join(f"`{k}`" for k in sorted(rule.reads)) or "nothing: the object alone"
    needs = _needs(rule)
    rows = [
        ("family", f"{fam}: {FAMILY_TEXT[fam]}"),
        ("phase", f"{rule.phase} (the {'mutating' if rule.phase == 'mutate' else 'validating'} "
                  f"webhook)"),
        ("default mode", mode),
        ("judges", _kinds(rule.kinds)),
        ("operations", ", ".join(sorted(rule.operations))),
        ("reads from the cluster", reads),
    ]
    if needs:
        rows.append(("offline", f"`envelope check` says \"not evaluated\" when the input has no "
                                f"{' or '.join(needs)} objects"))
    if "UPDATE" in rule.operations:
        rows.append(("on UPDATE", RATCHET_TEXT[rule.ratchet.value]
                     + ("; not judged when it leaves the part of the object the rule judges as "
                        "it was" if rule.judges is not None else "")))
    if rule.holds_back:
        rows.append(("holds back", ", ".join(f"[`{r}`]({r}.md)" for r in sorted(rule.holds_back))
                     + " when it reports on an object"))
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def page(rule: Rule, rules: RuleSet) -> str:
    """The markdown page of one rule (what ``envelope explain`` prints)."""
    doc = load_doc(rule.id)
    ex = doc.example
    mode = rule.default_mode.value
    table = _facts(rule)
    failing, fixed = run_example(rules, ex, "failing"), run_example(rules, ex, "fixed")
    kind = str((_objects(ex.failing, "failing")[0]).get("kind"))
    parts = [
        f"# `{rule.id}`",
        "<!-- generated by `python -m app.ruledocs` from the rule's declaration and "
        f"app/ruledocs/data/{rule.id}.yaml; do not edit -->",
        f"{rule.summary[0].upper()}{rule.summary[1:]}.",
        table,
        "## What it checks",
        doc.what.strip(),
        "## Why",
        doc.why.strip(),
        "## Example",
        "Both manifests below are run through the engine by `tests/ruledocs/test_ruledocs.py`"
        + (", and through `envelope check`" if ex.operation == "CREATE" else "")
        + "; the answers shown are the ones it gives.",
    ]
    if ex.policy:
        parts += ["With this policy file:", _yaml_block(yaml.safe_dump(ex.policy, sort_keys=False))]
    if ex.cluster:
        parts += ["With these objects in the cluster" + (" (or in the same `envelope check` input)"
                                                         if ex.operation == "CREATE" else "") + ":",
                  _yaml_block(ex.cluster)]
    if ex.old:
        parts += ["The object as stored before the write:", _yaml_block(ex.old)]
    bad, good = EXPECT_TEXT[ex.expect]
    how = _operation_text(ex, kind)
    parts += [f"{bad}{how}:", _yaml_block(ex.failing), _answer(failing, rule.id),
              f"{good}{how}:", _yaml_block(ex.fixed), _answer(fixed, rule.id)]
    if doc.fix:
        parts += ["## How to fix", doc.fix.strip()]
    parts += [
        "## Modes",
        f"Default: **{mode}**. Set it in the policy file (`rules: {{{rule.id}: enforce|warn|off}}`, "
        f"[configuration.md](../configuration.md)) or with "
        f"`ENVELOPE_RULE_{rule.id.upper().replace('-', '_')}`.",
        "\n".join(f"- `{m}`: {MODE_TEXT[(rule.phase, m)]}" for m in ("enforce", "warn"))
        + "\n- `off`: the rule does not run",
        "## Exemptions and hints",
        hint(rule),
    ]
    return "\n\n".join(parts) + "\n"


def index_page(rules: RuleSet) -> str:
    rows = [f"| [`{r.id}`]({r.id}.md) | {family(r)} | {r.phase} | {r.default_mode.value} | "
            f"{r.summary} |" for r in sorted(rules.values(), key=lambda r: (family(r), r.id))]
    return ("# Rule reference\n\n<!-- generated by `python -m app.ruledocs`; do not edit -->\n\n"
            f"Envelope has {len(rules)} rules. Each page says what the rule checks, why (the "
            "incident or upstream behaviour it comes from), an example that fails and its fix "
            "(both run by `tests/ruledocs/test_ruledocs.py`), its modes and what it reads. "
            "`envelope rules` lists them; `envelope explain RULE` prints a page.\n\n"
            "| rule | family | phase | default | what |\n|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def pages(rules: RuleSet) -> dict[str, str]:
    """File name -> content of every page under docs/rules/."""
    out = {f"{rid}.md": page(rule, rules) for rid, rule in sorted(rules.items())}
    out["README.md"] = index_page(rules)
    return out


def write_pages(rules: RuleSet, directory: Path) -> list[str]:
    """Write the pages; remove pages of rules that no longer exist. Returns what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    wanted = pages(rules)
    for name, text in wanted.items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    for path in directory.glob("*.md"):
        if path.name not in wanted:
            path.unlink()
            changed.append(path.name)
    return changed

