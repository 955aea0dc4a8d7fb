"""``envelope quotas plan``: from a base (a cluster read with one LIST per kind, or files)
to a target (files), the ordered commands in which every intermediate state passes
Envelope's quota rules (``app/quotaview/plan.py``), as text or JSON
(``schemaVersion: quotaplan/v1``). Reads only: nothing is written to a cluster.

Why one module of ~440 lines: the subcommand's three modes (print a plan, ``--serve`` the
page, ``--git-ref`` plan from a git ref and commit on a branch) share its parser, the reading of
base and target, the linked files and the plan's text and JSON forms; each mode is a few
functions over those, and the planning itself is ``plan.py``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

import orjson

from app.core.config import ConfigError, Policy, load_policy
from app.core.ruleset import RuleSet, default_ruleset
from app.quotaview.inputs import read_cluster, read_files
from app.quotaview.plan import PLANNED_KINDS, Plan, key_of, plan
from app.quotaview.plancommands import command_of

__all__ = ["SCHEMA", "gitops_owners", "main", "parser", "plan_json"]

SCHEMA = "quotaplan/v1"

#: What says a GitOps tool owns an object (a live patch is put back at its next sync):
#: Argo CD's tracking annotation (the default method since 3.0) and its instance label
#: (the label method; docs/user-guide/resource_tracking.md at argo-cd release-3.3), Flux's
#: kustomize-controller and helm-controller labels.
GITOPS_ANNOTATIONS = {"argocd.argoproj.io/tracking-id": "Argo CD"}
GITOPS_LABELS = {"app.kubernetes.io/instance": "Argo CD (label tracking) or Helm",
                 "argocd.argoproj.io/instance": "Argo CD",
                 "kustomize.toolkit.fluxcd.io/name": "Flux",
                 "helm.toolkit.fluxcd.io/name": "Flux"}


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="envelope quotas plan",
        description="Plan a quota change: from the cluster (--kubeconfig, read only) or --base "
                    "files to the target files (--to, or PATH), the ordered kubectl commands "
                    "in which every intermediate state passes Envelope's quota rules (givers "
                    "before receivers, a department grows before its projects and shrinks after "
                    "them). Each patch tests every value it read before replacing it, so a "
                    "concurrent change makes it fail. Exit 0 with a plan, 1 when no admissible "
                    "order reaches the target (the blocking object and rule are named), 2 when "
                    "an input cannot be read.")
    out.add_argument("paths", nargs="*", metavar="PATH", help="target files or directories (as --to)")
    out.add_argument("--to", action="append", default=[], metavar="PATH",
                     help="target files or directories: the objects as they should be; repeatable")
    out.add_argument("--base", action="append", default=[], metavar="PATH",
                     help="files that stand for the cluster; repeatable")
    out.add_argument("--kubeconfig", metavar="PATH",
                     help="read the base from this cluster (one LIST per kind; nothing is written)")
    out.add_argument("--prune", action="store_true",
                     help="delete base objects of a kind the target files hold that they do not "
                          "list (without it the target files are laid over the base)")
    out.add_argument("--git-ref", metavar="REF",
                     help="git mode: the base is the tenancy files as they are at REF (git show, "
                          "not the working tree) under --git-path")
    out.add_argument("--git-path", action="append", default=[], metavar="PATH",
                     help="git mode: the files or directories (in the repository) the tenancy is "
                          "in; repeatable; default the whole tree")
    out.add_argument("--repo", default=".", metavar="DIR", help="git mode: the repository (default .)")
    out.add_argument("--branch", metavar="NAME",
                     help="git mode: write the change into the files value by value (comments and "
                          "padding kept) as one commit on this new local branch (git plumbing; "
                          "working tree and index untouched, nothing pushed)")
    out.add_argument("--profile", metavar="FILE",
                     help="linked files that move with a quota (linked.variables, "
                          "linked.resourceQuotas, linked.reminders; docs/quotas.md): mirrored "
                          "ResourceQuotas join the plan, variables are rewritten in git mode and "
                          "listed otherwise, reminders listed")
    out.add_argument("--serve", action="store_true",
                     help="open the planner's page on 127.0.0.1 over the base (--kubeconfig, --base "
                          "or --git-ref): bars, search, edits judged by the rules at once, export "
                          "of the commands once the plan fits; writes nothing to a cluster")
    out.add_argument("--port", type=int, default=4780,
                     help="--serve: the port on 127.0.0.1 (0: any free port)")
    out.add_argument("-o", "--output", choices=("text", "json"), default="text",
                     help=f"text (the commands, numbered) or json (schemaVersion {SCHEMA})")
    out.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                     help="policy file (rule modes) the plan is judged by, as the webhook's; "
                          "default $ENVELOPE_CONFIG")
    return out


def gitops_owners(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    """Planned objects a GitOps tool tracks: key -> which tool and by what."""
    out: dict[tuple[str, str, str], str] = {}
    for obj in objects:
        key = key_of(obj)
        meta = obj.get("metadata")
        if key is None or not isinstance(meta, dict):
            continue
        found = meta.get("annotations")
        annotations: dict[str, Any] = found if isinstance(found, dict) else {}
        found = meta.get("labels")
        labels: dict[str, Any] = found if isinstance(found, dict) else {}
        for name, tool in GITOPS_ANNOTATIONS.items():
            if name in annotations:
                out[key] = f"{tool} (annotation {name})"
        for name, tool in GITOPS_LABELS.items():
            if key not in out and name in labels:
                out[key] = f"{tool} (label {name}={labels[name]})"
    return out


def _target(base: list[dict[str, Any]], files: list[dict[str, Any]], prune: bool) -> list[dict[str, Any]]:
    from app.cluster.snapshot import merge

    if not prune:
        return merge(base, files)
    kinds = {k[0] for o in files if (k := key_of(o)) is not None}
    wanted = {k for o in files if (k := key_of(o)) is not None}
    kept = [o for o in base if (k := key_of(o)) is None or k[0] not in kinds or k in wanted]
    return merge(kept, files)


def _profile(args: argparse.Namespace) -> tuple[Any, list[str]]:
    if not args.profile:
        return None, []
    from app.quotaview.planlinks import ProfileError, load_profile

    try:
        with open(args.profile, encoding="utf-8") as f:
            return load_profile(f.read(), args.profile), []
    except OSError as exc:
        return None, [f"{args.profile}: {exc.strerror or exc}"]
    except ProfileError as exc:
        return None, [str(exc)]


def _linked(profile: Any, base: list[dict[str, Any]], target: list[dict[str, Any]]
            ) -> tuple[list[dict[str, Any]], list[Any]]:
    if profile is None:
        return target, []
    from app.quotaview.planlinks import link

    return link(profile, base, target)


def plan_json(planned: Plan, source: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    steps = []
    for i, step in enumerate(planned.steps, 1):
        command = command_of(step)
        steps.append({"index": i, "op": step.op, "kind": step.kind, "namespace": step.namespace,
                      "name": step.name, "why": step.why, "command": command.text(),
                      "kubectl": list(command.argv), "stdin": command.stdin,
                      "patch": list(command.patch)})
    return {"schemaVersion": SCHEMA, "source": source, "ok": planned.ok, "steps": steps,
            "blocked": [_blocker(b) for b in planned.blocked],
            "targetErrors": [_blocker(b) for b in planned.target_errors],
            "unplanned": planned.unplanned, "alreadyInBase": planned.already, "warnings": warnings}


def _blocker(b: Any) -> dict[str, str]:
    return {"kind": b.kind, "namespace": b.namespace, "name": b.name, "rule": b.rule,
            "message": b.message}


def _text(planned: Plan, source: dict[str, Any], warnings: list[str]) -> str:
    lines = [f"# plan from {source['base']} to {source['target']}, {source['at']}"]
    for warning in warnings:
        lines.append(f"# warning: {warning}")
    if planned.target_errors:
        first = planned.target_errors[0]
        lines.append(f"# the target does not pass Envelope; {first.kind} {first.name} over-reaches:")
        lines += [f"#   {b}" for b in planned.target_errors]
    for problem in planned.already:
        lines.append(f"# already so in the base (not blocking; no step makes it worse): {problem}")
    for problem in planned.unplanned:
        lines.append(f"# not planned: {problem}")
    for i, step in enumerate(planned.steps, 1):
        where = f"{step.namespace}/" if step.namespace else ""
        lines.append(f"# {i}. {step.op} {step.kind} {where}{step.name}: {step.why}")
        lines.append(command_of(step).text())
    if planned.blocked:
        lines.append("# blocked: no write below is admitted, in any order:")
        lines += [f"#   {b}" for b in planned.blocked]
    if planned.ok and not planned.steps:
        lines.append("# nothing to change")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    targets = [*args.paths, *args.to]
    if args.serve:
        return _run_serve(args, rules, policy)
    if not targets or not (args.base or args.kubeconfig or args.git_ref):
        print("envelope quotas plan: give the target (--to PATH or PATH) and a base "
              "(--kubeconfig, --base PATH or --git-ref REF)", file=sys.stderr)
        return 2
    files, problems = read_files(targets)
    profile, more = _profile(args)
    problems += more
    if args.git_ref:
        return _run_git(args, files, problems, rules, policy, profile)
    base: list[dict[str, Any]] = []
    if args.base:
        more_base, more = read_files(args.base)
        base += more_base
        problems += more
    if args.kubeconfig:
        from app.cluster.snapshot import merge

        live, more = read_cluster(args.kubeconfig, {"Node", *PLANNED_KINDS})
        problems += more
        base = merge(live, base)
    if problems:
        for problem in problems:
            print(f"envelope quotas plan: {problem}", file=sys.stderr)
        print(f"envelope quotas plan: {len(problems)} input problem(s); nothing was planned",
              file=sys.stderr)
        return 2
    target, linked = _linked(profile, base, _target(base, files, args.prune))
    planned = plan(base, target, rules, policy)
    touched = {s.key for s in planned.steps}
    warnings = [f"{key[0]} {key[2]} is tracked by {tool}: a live patch is put back at the next "
                f"sync; the change belongs in git"
                for key, tool in sorted(gitops_owners(base).items()) if key in touched]
    source = {"base": f"cluster ({args.kubeconfig})" if args.kubeconfig else ", ".join(args.base),
              "target": ", ".join(targets),
              "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if args.kubeconfig and args.base:
        source["base"] += " with " + ", ".join(args.base)
    if args.output == "json":
        report = plan_json(planned, source, warnings)
        report["linked"] = [item.as_dict() for item in linked]
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(_text(planned, source, warnings) + _linked_text(linked, written=False))
    return 0 if planned.ok else 1


def _linked_text(linked: list[Any], *, written: bool) -> str:
    lines = []
    for item in linked:
        if item.kind == "reminder":
            lines.append(f"# linked, update by hand: {item.where}" + (f" ({item.note})" if item.note else ""))
        elif item.kind == "variable":
            done = "rewritten in the commit" if written else "update it"
            lines.append(f"# linked variable {item.key} in {item.where}: {item.before} -> {item.after} "
                         f"({done})")
        else:
            lines.append(f"# linked {item.where} {item.key}: {item.before} -> {item.after} ({item.note})")
    return "".join(line + "\n" for line in lines)


def _base(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str], str]:
    """The base from --base files and/or --kubeconfig, its problems, and how to name it."""
    base: list[dict[str, Any]] = []
    problems: list[str] = []
    if args.base:
        base, problems = read_files(args.base)
    name = ", ".join(args.base)
    if args.kubeconfig:
        from app.cluster.snapshot import merge

        live, more = read_cluster(args.kubeconfig, {"Node", *PLANNED_KINDS})
        problems += more
        base = merge(live, base)
        name = f"cluster ({args.kubeconfig})" + (f" with {name}" if name else "")
    return base, problems, name


def _run_serve(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    from app.quotaview.planserve import Committer, Planner, serve

    commit: Committer | None = None
    if args.git_ref:
        from pathlib import Path

        from app.quotaview.plangit import GitError, read_ref

        try:
            at_ref = read_ref(Path(args.repo), args.git_ref, args.git_path)
        except GitError as exc:
            print(f"envelope quotas plan: {exc}", file=sys.stderr)
            return 2
        base, problems = [o for _, _, o in at_ref.objects], at_ref.problems
        name = f"git {args.git_ref} ({at_ref.commit[:12]})"
        commit = _committer(Path(args.repo), at_ref, args.git_ref)
    elif args.base or args.kubeconfig:
        base, problems, name = _base(args)
    else:
        print("envelope quotas plan --serve: give the base (--kubeconfig, --base PATH or --git-ref REF)",
              file=sys.stderr)
        return 2
    if problems:
        for problem in problems:
            print(f"envelope quotas plan: {problem}", file=sys.stderr)
        return 2
    at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        server, thread = serve(Planner(base, rules, policy, name, at, commit), args.port)
    except OSError as exc:
        print(f"envelope quotas plan: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    port = server.server_address[1]
    print(f"envelope quotas plan: http://127.0.0.1:{port}/ (Ctrl-C to stop; nothing is written)", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _committer(repo: Any, at_ref: Any, ref: str) -> Any:
    """The page's commit in git mode: the target written into the files at the ref, one
    commit on a new local branch (``plangit.commit_change``)."""
    from app.quotaview.plan import state_of
    from app.quotaview.plangit import GitError, commit_change
    from app.quotaview.planserve import CommitError

    def commit(target: list[dict[str, Any]], branch: str) -> dict[str, Any]:
        try:
            change = commit_change(repo, at_ref, state_of(target)[0], branch, message=
                                   f"Quota change planned in envelope quotas plan --serve\n\n"
                                   f"From {ref} ({at_ref.commit[:12]}); every intermediate state "
                                   f"admitted by Envelope's quota rules.\n")
        except GitError as exc:
            raise CommitError(str(exc)) from exc
        return {"branch": change.branch, "commit": change.commit, "files": change.changed_files,
                "notWritten": change.not_written, "diff": change.diff}

    return commit


def _linked_rewrites(repo: Any, commit: str, linked: list[Any]) -> dict[str, tuple[str, str]] | None:
    """The linked files' variables rewritten at ``commit``: path -> (old text, new text);
    None (said on stderr) when a file cannot be read or lacks a variable's line."""
    from app.quotaview.plangit import GitError, blob_at
    from app.quotaview.planlinks import rewrite_variables

    extra: dict[str, tuple[str, str]] = {}
    by_file: dict[str, dict[str, str]] = {}
    for item in linked:
        if item.kind == "variable" and item.after is not None:
            by_file.setdefault(item.where, {})[item.key] = item.after
    for path, changes in by_file.items():
        try:
            old = blob_at(repo, commit, path)
        except GitError as exc:
            print(f"envelope quotas plan: linked file {path}: {exc}", file=sys.stderr)
            return None
        new, missing = rewrite_variables(old, changes)
        if missing:
            print(f"envelope quotas plan: linked file {path} has no line for {', '.join(missing)}; "
                  f"nothing committed", file=sys.stderr)
            return None
        extra[path] = (old, new)
    return extra


def _run_git(args: argparse.Namespace, files: list[dict[str, Any]], problems: list[str],
             rules: RuleSet, policy: Policy, profile: Any = None) -> int:
    from pathlib import Path

    from app.quotaview.plan import state_of
    from app.quotaview.plangit import GitError, commit_change, read_ref

    repo = Path(args.repo)
    try:
        at_ref = read_ref(repo, args.git_ref, args.git_path)
    except GitError as exc:
        print(f"envelope quotas plan: {exc}", file=sys.stderr)
        return 2
    problems = problems + at_ref.problems
    if problems:
        for problem in problems:
            print(f"envelope quotas plan: {problem}", file=sys.stderr)
        print(f"envelope quotas plan: {len(problems)} input problem(s); nothing was planned",
              file=sys.stderr)
        return 2
    base = [obj for _, _, obj in at_ref.objects]
    target, linked = _linked(profile, base, _target(base, files, args.prune))
    planned = plan(base, target, rules, policy)
    extra: dict[str, tuple[str, str]] = {}
    if planned.ok and args.branch:
        rewritten = _linked_rewrites(repo, at_ref.commit, linked)
        if rewritten is None:
            return 2
        extra = rewritten
    source = {"base": f"git {args.git_ref} ({at_ref.commit[:12]})",
              "target": ", ".join([*args.paths, *args.to]),
              "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    report = plan_json(planned, source, [])
    report["linked"] = [item.as_dict() for item in linked]
    if planned.ok and args.branch:
        try:
            change = commit_change(repo, at_ref, state_of(target)[0], args.branch,
                                   extra=extra, message=
                                   f"Quota change planned by envelope quotas plan\n\n"
                                   f"From {args.git_ref} ({at_ref.commit[:12]}): "
                                   f"{len(planned.steps)} write(s), every intermediate state "
                                   f"admitted by Envelope's quota rules.\n")
        except GitError as exc:
            print(f"envelope quotas plan: nothing committed: {exc}", file=sys.stderr)
            return 2
        report["git"] = {"branch": change.branch, "commit": change.commit, "files": change.changed_files,
                         "notWritten": change.not_written, "diff": change.diff}
    if args.output == "json":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(_text(planned, source, []) + _linked_text(linked, written="git" in report))
        if "git" in report:
            sys.stdout.write(report["git"]["diff"])
            for item in report["git"]["notWritten"]:
                sys.stdout.write(f"# not written: {item}\n")
            sys.stdout.write(f"# committed {report['git']['commit']} on new branch {args.branch} "
                             f"(working tree and index untouched, nothing pushed)\n")
    return 0 if planned.ok else 1


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    rules = default_ruleset()
    try:
        policy = load_policy(args.config, None, rules)
    except ConfigError as exc:
        print(f"envelope: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return run(args, rules, policy)
