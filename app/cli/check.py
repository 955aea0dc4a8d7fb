"""``envelope check``: the rules over manifest files, offline (its flags, strict field
validation, current-format templates, the report and its exit status)."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.cli.chart_render import HelmOptions, find_helm, no_helm_message, render_charts
from app.cluster.fieldschema import FIELDS_RULE
from app.cluster.static import Loaded, Manifest, Skipped, load
from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.exemptions import watched_for
from app.core.frontdoor import DEFAULT_NAMESPACE, FrontDoor, placed
from app.core.ruleset import RuleSet
from app.k8s.util import visible
from app.render import FORMATS, render, render_input_errors
from app.render.reports import FailOn, ObjectResult, Report, not_evaluated
from app.rules.base import Finding, Severity


def _check_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="run the rules over manifest files, offline",
        description="Run Envelope's rules over manifests, read as kubectl reads them. Exit 0: "
                    "nothing at or above --fail-on; 1: findings at or above it; 2: unreadable "
                    "input or no Kubernetes objects found.")
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="file or directory to check, like -f")
    check.add_argument("-f", "--filename", action="append", default=[], dest="filenames",
                       metavar="PATH", help="file, directory (walked recursively) or - for "
                                            "stdin; repeatable")
    check.add_argument("-o", "--output", choices=FORMATS, default="text",
                       help="text (alias human), json, sarif (SARIF 2.1.0), junit (one testcase "
                            "per object) or github (workflow-command annotations)")
    check.add_argument("--fail-on", choices=("error", "warning", "change"), default="error",
                       help="lowest severity that makes the exit status 1 (default: error); "
                            "change: also any object the webhook would mutate (the files are "
                            "not what the cluster stores; `envelope fix` writes the changes)")
    check.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                       help="leave out files and directories whose path (relative to a walked "
                            "directory, or as given) or name matches GLOB; repeatable")
    check.add_argument("--allow-empty", action="store_true",
                       help="exit 0 instead of 2 when no Kubernetes objects are found")
    check.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                       help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")
    check.add_argument("--kubeconfig", metavar="PATH",
                       help="also read Nodes, LimitRanges, ResourceQuotas, KAI trees and "
                            "WorkerPools from this cluster (one LIST each; api.ate.dev "
                            "ActorTemplates are placed against its WorkerPools); the files' "
                            "objects replace the cluster's of the same name")
    check.add_argument("--quiet", action="store_true",
                       help='leave out the "not evaluated" notes (rules with nothing to judge in '
                            "the input), in every output format")
    helm = check.add_argument_group(
        "Helm charts", "a directory with a Chart.yaml and templates/ is rendered with helm "
                       "template ($ENVELOPE_HELM, helm on PATH, or $ENVELOPE_CONTROLPLANE_BIN/helm; "
                       "exit 2 without one) and its objects judged, named by their template")
    helm.add_argument("--helm-values", action="append", default=[], metavar="FILE",
                      help="a values file for helm template (its -f); repeatable")
    helm.add_argument("--helm-set", action="append", default=[], metavar="KEY=VALUE",
                      help="a value for helm template (its --set); repeatable")
    helm.add_argument("--helm-release", default="release-name", metavar="NAME",
                      help="default: %(default)s (as helm's); the release name to render with")
    helm.add_argument("--helm-namespace", default="default", metavar="NS",
                      help="the namespace to render for (helm's --namespace; default: %(default)s)")
    check.add_argument("-n", "--namespace", metavar="NS",
                       help="the namespace of objects written without one, as `kubectl apply "
                            "-n` places them (their LimitRanges, quotas and rules are that "
                            "namespace's); default: the kubeconfig context's namespace with "
                            "--kubeconfig, else default")
    check.add_argument("--validate", choices=("strict", "warn", "ignore", "true", "false"),
                       default="strict",
                       help="field validation as kubectl apply --validate does it, from the "
                            "schemas of the Kubernetes version in app/data and the published CRD "
                            "schemas of the custom resources Envelope judges (KAI, agent-substrate): "
                            "strict (or true) "
                            "refuses an object with an unknown field, warn warns and judges it "
                            "without the field, ignore (or false) drops it silently; an unknown "
                            "kind of a built-in API group is refused in every mode")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("envelope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def _judged(m: Manifest, door: FrontDoor, before: list[Finding]) -> ObjectResult:
    """One manifest judged as a CREATE (mutate, then validate; ``app.core.frontdoor``),
    with the findings strict field validation made before."""
    judged = door.judge(m.obj)
    # The report keeps what it writes (findings, changes, the patch), not the mutated copy
    # of the object nor each rule's outcome: 50,000 objects held both (issue 38, class 7).
    return ObjectResult(judged.kind, judged.api_version, judged.namespace, judged.name,
                        m.source, m.document, m.line,
                        replace(judged.evaluation, obj=None, results={}), before, m.line_of)


def _validate_fields(manifests: list[Manifest], validate: str
                     ) -> list[tuple[Manifest | ObjectResult, list[Finding]]]:
    """``kubectl apply --validate`` offline, per manifest in input order: the manifest to
    judge and its field warnings, or the refusal that replaces judging it. strict: an
    object with an unknown field is refused whole, as the API server refuses it, and is
    neither judged nor part of the cluster the rules see; warn: a warning per field and the
    object judged without them (what the server stores); ignore: dropped silently. An
    unknown kind or version of a built-in group is refused in every mode (kubectl cannot
    map it)."""
    from app.cluster.fieldschema import default_schema, prune

    schema = default_schema()
    out: list[tuple[Manifest | ObjectResult, list[Finding]]] = []
    for m in manifests:
        problems = schema.check(m.obj)
        fields_only = all(p.unknown_field for p in problems)
        if not problems or (validate == "ignore" and fields_only):
            out.append((replace(m, obj=prune(m.obj, problems)) if problems else m, []))
            continue
        severity: Severity = "warning" if validate == "warn" and fields_only else "error"
        advice = ("the API server drops it (--validate=warn)" if severity == "warning" else
                  "kubectl apply refuses the object (strict field validation); fix or remove "
                  "the field")
        findings = [Finding(severity, FIELDS_RULE, p.path,
                            f"{p.message}; {advice}" if p.unknown_field else p.message)
                    for p in problems]
        if severity == "warning":
            out.append((replace(m, obj=prune(m.obj, problems)), findings))
            continue
        raw_meta = m.obj.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        out.append((ObjectResult(str(m.obj.get("kind", "")), str(m.obj.get("apiVersion", "")),
                                 str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                                 m.source, m.document, m.line, before=findings,
                                 line_of=m.line_of), []))
    return out


def _kinds(objects: list[dict[str, Any]]) -> set[str]:
    """The view names (``app.k8s.kinds``) of the kinds among ``objects``: a Karpenter
    NodePool is not KAI's."""
    from app.k8s.kinds import name_of, ref_of

    return {name_of(*ref_of(o)) for o in objects}


VALIDATE_ALIASES = {"true": "strict", "false": "ignore"}


def _in_chart(source: str, charts: list[str]) -> bool:
    """A file of a chart directory that helm does not install as it is (not crds/)."""
    path = Path(source)
    return any(path.is_relative_to(c) and not path.is_relative_to(Path(c) / "crds") for c in charts)


def _context_namespace(kubeconfig: str) -> str:
    """The namespace of the kubeconfig's current context (kubectl's default for objects
    written without one); ``default`` when it names none or cannot be read (the client
    below then says why)."""
    try:
        from kubernetes import config as kube_config

        _, active = kube_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=kubeconfig)
        found = (active or {}).get("context", {}).get("namespace")
    except Exception:  # unreadable: the KubeClient below reports it
        return DEFAULT_NAMESPACE
    return str(found) if found else DEFAULT_NAMESPACE


def _render_charts(loaded: Loaded, helm: HelmOptions | None) -> bool:
    """Render the Helm charts among the inputs into ``loaded`` (their other files skipped);
    False (said on stderr) when there are charts and no helm."""
    charts = [c for c in loaded.charts  # a subchart is rendered by the chart that holds it
              if not any(Path(c).is_relative_to(Path(o)) and c != o for o in loaded.charts)]
    if charts:
        helm_bin = find_helm()
        if helm_bin is None:
            print(f"envelope check: {no_helm_message(charts)}", file=sys.stderr)
            return False
        # A chart's other files (files/, values) reach the cluster only through its
        # templates; crds/ is installed by helm as it is, so it is judged as files.
        inside = [m for m in loaded.manifests if _in_chart(m.source, charts)]
        loaded.manifests = [m for m in loaded.manifests if m not in inside]
        loaded.skipped.extend(Skipped(p, "in a Helm chart, outside templates/ and crds/: reaches "
                                         "the cluster only through the rendered templates")
                              for p in sorted({m.source for m in inside}))
        rendered = set(render_charts(charts, helm_bin, helm or HelmOptions(), loaded))
        loaded.skipped = [s for s in loaded.skipped
                          if not (s.path.endswith("/templates") and str(Path(s.path).parent) in rendered)]
    return True


def _cluster_context(kubeconfig: str, rules: RuleSet, policy: Policy, manifests: list[Manifest]
                     ) -> tuple[list[dict[str, Any]], set[str]] | None:
    """The cluster's objects the rules read, merged with the manifests (one LIST per
    kind), and the kinds listed (the view holds all of those); None (said on stderr)
    when the cluster cannot be read."""
    from app.cluster.kube import KubeClient, kube_configuration
    from app.cluster.snapshot import context_kinds, merge, snapshot

    try:
        client = KubeClient(kube_configuration(kubeconfig))
    except Exception as exc:
        print(f"envelope check: cannot use --kubeconfig {kubeconfig}: {exc}", file=sys.stderr)
        return None
    # What the webhook watches: the kinds the rules read, and what the policy needs
    # (Namespaces for label-selected exceptions, EnvelopeExceptions when it delegates).
    listed = context_kinds(rules.reads | watched_for(policy))
    live = snapshot(client, listed)
    if live.problems:
        for problem in live.problems:
            print(f"envelope check: {problem}", file=sys.stderr)
        return None
    return merge(live.objects, (m.obj for m in manifests)), {kind.name for kind in listed}


def run_check(paths: list[str], rules: RuleSet, policy: Policy, output: str, *,
              fail_on: FailOn = "error",
              exclude: list[str] | None = None, allow_empty: bool = False,
              kubeconfig: str | None = None, validate: str = "strict", quiet: bool = False,
              helm: HelmOptions | None = None, namespace: str | None = None) -> int:
    loaded = load(paths, exclude or ())
    if not _render_charts(loaded, helm):
        return 2
    if loaded.errors:
        errors = sorted(loaded.errors, key=lambda e: (e.source, e.document, e.line))
        for error in errors:
            print(f"envelope check: {visible(str(error))}", file=sys.stderr)
        sys.stdout.write(render_input_errors(output, errors))
        print(f"envelope check: {len(loaded.errors)} input problem(s); nothing was checked",
              file=sys.stderr)
        return 2
    manifests = loaded.manifests
    skipped = [(s.path, s.reason) for s in loaded.skipped]
    if not manifests:
        for path, reason in skipped[:20]:
            print(f"envelope check: skipped {visible(path)}: {visible(reason)}", file=sys.stderr)
        print(f"envelope check: no Kubernetes objects found in {visible(' '.join(paths))}"
              + (f" ({len(skipped)} path(s) skipped)" if skipped else "")
              + ("" if allow_empty else "; exit 2 so that a wrong path does not pass"),
              file=sys.stderr)
        return 0 if allow_empty else 2
    where = namespace or (_context_namespace(kubeconfig) if kubeconfig else DEFAULT_NAMESPACE)
    manifests = [replace(m, obj=placed(m.obj, where)) for m in manifests]
    fielded = _validate_fields(manifests, validate)
    manifests = [m for m, _ in fielded if isinstance(m, Manifest)]
    context: list[dict[str, Any]] = []
    complete: set[str] = set()  # the kinds listed from a cluster: the view holds all of them
    if kubeconfig:
        from_cluster = _cluster_context(kubeconfig, rules, policy, manifests)
        if from_cluster is None:
            return 2
        context, complete = from_cluster
    # Files hold what their author put in them; the kinds listed from a cluster are whole.
    view = StaticView(context or (m.obj for m in manifests), rules.indexes, complete=complete)
    gc.freeze()  # the parsed tenancy lives to the end: keep the collector from rescanning it
    # api.ate.dev templates are placed against every namespace's pools (app.core.frontdoor).
    door = FrontDoor(rules, view, policy, objects=[*context, *(m.obj for m in manifests)],
                     namespace=where, admit=True)
    objects = []
    for m, field_findings in fielded:
        if isinstance(m, ObjectResult):  # refused by strict field validation
            objects.append(m)
            continue
        objects.append(_judged(m, door, field_findings))
    declared = list(rules.values())
    report = Report(objects, declared,
                    [] if quiet else not_evaluated(
                        declared, ((o.api_version.rpartition("/")[0], o.kind) for o in objects),
                        present=_kinds(context)),
                    skipped, _version())
    return _report(report, output, fail_on)


def _report(report: Report, output: str, fail_on: FailOn) -> int:
    """Write the report in ``output`` (a renderer of ``app.render``) and return the exit
    status ``--fail-on`` gives it: the seam for what is reported and what fails."""
    sys.stdout.write(render(report, output, fail_on))
    return 1 if report.failed(fail_on) else 0
