"""The ``envelope`` command: its top-level parser and the dispatch to the subcommands, one
module each (check, serve, audit_cmd, fix_cmd, reference; ``quotas`` in app/quotaview/,
``gitops-config`` in app/chart/gitops.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NoReturn

from app.cli.audit_cmd import _audit_parser, run_audit
from app.cli.chart_render import HelmOptions
from app.cli.check import VALIDATE_ALIASES, _check_parser, _version, run_check
from app.cli.fix_cmd import _fix_parsers, _run_fix
from app.cli.reference import _reference_parsers, run_explain, run_rules, run_webhook_config
from app.cli.serve import _serve_parser, _serve_problem, run_serve
from app.core.config import ConfigError, did_you_mean, load_policy
from app.core.ruleset import default_ruleset
from app.quotaview.command import add_parser as quotaview_parser
from app.quotaview.command import run as run_quotaview

__all__ = ["main"]


class _Help(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the text already gives it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None
                or action.default is argparse.SUPPRESS or action.default in (False, [], "")):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for mistyped subcommands and choices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            message += did_you_mean(match[1], re.findall(r"'([^']*)'", match[2]))
        super().error(message)


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    extra: list[str]) -> NoReturn:
    """Unknown arguments, refused with the usage of the subcommand they were given to (not
    the top level's) and the closest flag that subcommand has."""
    sub = _subcommands(parser).get(args.command, parser)
    flags = [o for action in sub._actions for o in action.option_strings]
    first = next((a.split("=", 1)[0] for a in extra if a.startswith("-")), extra[0])
    sub.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(first, flags)}")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="envelope", description=(
        "Envelope: a Kubernetes admission webhook that strips CPU limits while keeping memory "
        "request = limit, and rejects GPU quota trees and actor sandboxes that cannot hold. "
        "`envelope serve` runs the webhook; `envelope check` runs the same rules over files; "
        "`envelope audit` judges what a cluster holds; `envelope fix` writes the webhook's "
        "mutations into manifest files (`envelope krm-fn` inside kustomize or kpt); "
        "`envelope webhook-config` prints the "
        "webhook configuration a policy needs; `envelope rules` and `envelope explain RULE` "
        "are the rule reference."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands")

    _serve_parser(sub)
    _check_parser(sub)
    _audit_parser(sub)
    _fix_parsers(sub)
    quotaview_parser(sub)
    config = sub.add_parser(
        "webhook-config",
        help="print the mutating webhook's matchConditions for a policy",
        description="Print the mutating webhook's matchConditions for a policy, as a "
                    "strategic-merge patch for the chart's MutatingWebhookConfiguration: the "
                    "API server then sends only the writes some enabled rule could change.")
    config.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                        help="policy file whose modes decide the conditions (env ENVELOPE_CONFIG)")
    config.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                        help="yaml or json")
    config.add_argument("--in-tree", action="store_true",
                        help="also print the MutatingAdmissionPolicy and binding (Kubernetes "
                             ">= 1.36) that apply the policy's enforced cpu-limits and "
                             "memory-limit inside the API server, the ValidatingAdmissionPolicy "
                             "and binding for memory-request-equals-limit (Deny or Warn), and "
                             "shrink the webhook's matchConditions to the writes they do not "
                             "answer (docs/in-tree.md)")
    config.add_argument("--exclude-namespace", action="append", default=None, metavar="NS",
                        help="with --in-tree: a namespace the mutating webhook never sees, "
                             "which the policy's binding must exclude too (repeatable; "
                             "kube-system always)")
    config.add_argument("--split-patch", default=None, metavar="PATH",
                        help="with --in-tree: write the JSON patch (RFC 6902) that splits the "
                             "chart's validating webhook so that it skips the rules a "
                             "ValidatingAdmissionPolicy warns for, in the writes the policy "
                             "answers (needed, and refused without it, when a compiled "
                             "validate rule is in warn mode; empty list otherwise)")
    _reference_parsers(sub)
    from app.chart.gitops import add_parser as add_gitops_parser  # envelope gitops-config

    add_gitops_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``envelope``'s entry point: parse, load the rule set and the policy, run the
    subcommand.

    Why one function of ~74 lines: the dispatch table of the subcommands, one branch each,
    each a call into the subcommand's module; ``check`` and ``serve`` turn their errors
    into exit status 2 here.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["quotas", "plan"]:  # its own parser: `quotas` takes PATHs (a dir named plan: ./plan)
        from app.quotaview.plancli import main as run_quota_plan

        return run_quota_plan(argv[2:])
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_unknown(parser, args, extra)
    rules = default_ruleset()
    if args.command == "rules":  # the reference reads declarations only, never a policy
        return run_rules(rules, args.output, args.family)
    if args.command == "explain":
        return run_explain(rules, args.rule)
    try:
        policy = load_policy(args.config, None, rules)
    except ConfigError as exc:
        print(f"envelope: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        paths = [*args.paths, *args.filenames]
        if not paths:
            print("envelope check: give at least one file or directory (PATH or -f PATH)",
                  file=sys.stderr)
            return 2
        try:
            return run_check(paths, rules, policy, args.output, fail_on=args.fail_on,
                             exclude=args.exclude, allow_empty=args.allow_empty,
                             kubeconfig=args.kubeconfig,
                             validate=VALIDATE_ALIASES.get(args.validate, args.validate),
                             quiet=args.quiet,
                             helm=HelmOptions(args.helm_values, args.helm_set, args.helm_release,
                                              args.helm_namespace),
                             namespace=args.namespace)
        except Exception as exc:  # a bug of ours: say so in one line, the details on request
            if os.environ.get("ENVELOPE_DEBUG"):
                raise
            print(f"envelope check: internal error {type(exc).__name__}: {str(exc)[:300]} "
                  f"(a bug; ENVELOPE_DEBUG=1 shows the traceback)", file=sys.stderr)
            return 2
    if args.command == "audit":
        return run_audit(args, rules, policy)
    if args.command in ("fix", "krm-fn"):
        return _run_fix(args, rules, policy)
    if args.command == "quotas":
        return run_quotaview(args, rules, policy)
    if args.command == "webhook-config":
        return run_webhook_config(rules, policy, args.output, in_tree=args.in_tree,
                                  excluded=args.exclude_namespace or [],
                                  split_patch=args.split_patch)
    if args.command == "gitops-config":
        from app.chart.gitops import run_gitops_config

        return run_gitops_config(args, rules, policy)
    problem = _serve_problem(args)
    if problem:
        print(f"envelope serve: {problem}", file=sys.stderr)
        return 2
    try:
        return run_serve(args, rules, policy)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a port taken between the check and the bind, an unreadable file
        print(f"envelope serve: {exc.strerror or exc}"
              + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
