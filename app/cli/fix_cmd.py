"""``envelope fix`` and ``envelope krm-fn``: their flags and dispatch (app/fix/edit.py,
app/fix/krmfn.py)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.core.config import Policy
from app.core.ruleset import RuleSet


def _fix_parsers(sub: Any) -> None:
    """``envelope fix`` and ``envelope krm-fn`` (app/fix/edit.py, app/fix/krmfn.py)."""
    fix = sub.add_parser(
        "fix", help="rewrite manifests in place so they are what Envelope would store",
        description="Write the mutations `envelope check` reports into the manifest files "
                    "(only the changed values' bytes and the lines removed or added; "
                    "comments, order, quoting and layout kept), so the files in git are what "
                    "the cluster stores. Exit 0: written, or nothing to change; 1: with "
                    "--diff/--check, some file would change; 2: a file refused (Helm "
                    "template, unreadable, or a change that cannot be written in place).")
    fix.add_argument("paths", nargs="*", metavar="PATH",
                     help="file or directory (walked recursively); - reads stdin and writes "
                          "the fixed stream to stdout")
    fix.add_argument("-f", "--filename", action="append", default=[], dest="filenames",
                     metavar="PATH", help="file, directory or -; repeatable")
    shown = fix.add_mutually_exclusive_group()
    shown.add_argument("--diff", action="store_true",
                       help="print a unified diff of what would change; write nothing")
    shown.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 when some file would change")
    fix.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                     help="leave out files and directories matching GLOB; repeatable")
    fix.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                     help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")
    fix.add_argument("--memory", choices=("raise-request", "lower-limit"), default=None,
                     help="where a memory request is below its limit, write them equal: "
                          "raise-request (the request becomes the limit) or lower-limit (the "
                          "limit becomes the request), in every object; without it neither is "
                          "written (not even where the policy's memoryBelowLimit selects the "
                          "namespace) and memory-request-equals-limit keeps reporting them")
    krm = sub.add_parser(
        "krm-fn", help="a KRM function (kustomize/kpt) applying Envelope's mutations",
        description="Read a KRM ResourceList on stdin (kustomize exec function, kpt fn), "
                    "write Envelope's mutations into its items and write the ResourceList, "
                    "with results, to stdout. Exit 1 when an item cannot be fixed.")
    krm.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                     help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")


def _run_fix(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    if args.command == "krm-fn":
        from app.fix.krmfn import run_krm_fn

        return run_krm_fn(rules, policy)
    from app.fix.edit import run_fix, with_memory_action

    paths = [*args.paths, *args.filenames]
    if not paths:
        print("envelope fix: give at least one file or directory (PATH, -f PATH, or - for stdin)",
              file=sys.stderr)
        return 2
    mode = "diff" if args.diff else "check" if args.check else "write"
    return run_fix(paths, rules, with_memory_action(policy, args.memory), mode=mode,
                   exclude=args.exclude)
