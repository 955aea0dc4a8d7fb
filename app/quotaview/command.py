"""``envelope quotas``: its flags, its sources (files, a cluster, files over a cluster or
over base files) and its outputs."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from app.core.config import Policy
from app.core.ruleset import RuleSet
from app.crds.kai import RESOURCES
from app.quotaview.inputs import read_cluster, read_files
from app.quotaview.model import QUOTA_KINDS, Tree, as_json, compare, tree_of

__all__ = ["add_parser", "run"]

DEFAULT_WIDTH = 100


def add_parser(sub: Any) -> None:
    quotas = sub.add_parser(
        "quotas", help="draw the KAI quota trees (text, html or json)",
        description="Draw the KAI quota trees: node pools, their departments and projects, "
                    "KAI Queue trees, with guarantees, limits, pool cards, allocated amounts "
                    "(Queue status.allocated) and the quota rules' findings. With files and "
                    "--kubeconfig (or --base), the files are a change over the cluster (or "
                    "over the base files) and changed queues show before -> after. Exit 0, "
                    "or 2 when the input cannot be read. `envelope quotas plan --help`: the "
                    "ordered commands that land a change.")
    quotas.add_argument("paths", nargs="*", metavar="PATH", help="file or directory, like -f")
    quotas.add_argument("-f", "--filename", action="append", default=[], dest="filenames",
                        metavar="PATH", help="file, directory or - for stdin; repeatable")
    quotas.add_argument("--kubeconfig", metavar="PATH",
                        help="read the quota objects and Nodes from this cluster (one LIST "
                             "each, as check --kubeconfig); files given too are the change "
                             "under review, drawn over the cluster")
    quotas.add_argument("--base", action="append", default=[], metavar="PATH",
                        help="files that stand for the cluster (e.g. the main branch's "
                             "tenancy); the other files are the change under review; repeatable")
    quotas.add_argument("-o", "--output", choices=("text", "html", "json"), default="text",
                        help="text (bars for a terminal), html (one self-contained page) or "
                             "json (schemaVersion quotas/v1)")
    quotas.add_argument("--resource", choices=RESOURCES, default="gpu",
                        help="what the text view draws (html and json carry all three)")
    quotas.add_argument("--width", type=int, default=None,
                        help=f"text width in columns (default $COLUMNS, else {DEFAULT_WIDTH})")
    quotas.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="ANSI colour in text: auto = only on a terminal and without $NO_COLOR")
    quotas.add_argument("--collapse-above", type=int, default=None, metavar="N",
                        help="html: departments start collapsed when the page has more than N "
                             "projects (default 200); those with findings, over-commit or "
                             "changes stay open")
    quotas.add_argument("--screenshot", metavar="PNG",
                        help="html: also render the page in headless Chromium and save a "
                             "screenshot (needs chromium; e2e/controlplane/install-chromium.sh)")
    quotas.add_argument("--no-findings", action="store_true",
                        help="draw the numbers only, without running the quota rules (about half "
                             "the time on a 10,000-project tenancy)")
    quotas.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                        help="policy file (rule modes) for the findings; default $ENVELOPE_CONFIG")


def _width(args: argparse.Namespace) -> int:
    if args.width:
        return int(args.width)
    try:
        return int(os.environ.get("COLUMNS", "")) or DEFAULT_WIDTH
    except ValueError:
        return DEFAULT_WIDTH


def _color(choice: str) -> bool:
    if choice == "auto":
        return sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return choice == "always"


def sources(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> tuple[Tree | None, list[str]]:
    """The tree to draw (None and the problems when an input cannot be read)."""
    from app.cluster.snapshot import merge

    paths = [*args.paths, *args.filenames]
    files, problems = read_files(paths) if paths else ([], [])
    base: list[dict[str, Any]] | None = None
    if args.base:
        base, more = read_files(args.base)
        problems += more
    if args.kubeconfig:
        live, more = read_cluster(args.kubeconfig, {"Node", *QUOTA_KINDS})
        problems += more
        base = live if base is None else merge(live, base)
    if problems:
        return None, problems
    gc.freeze()  # the parsed objects live to the end: keep the collector from rescanning them
    judge_all: list[dict[str, Any]] | None = None if not args.no_findings else []
    if base is None:
        return tree_of(files, rules, policy, judged=judge_all), []
    if not paths:
        return tree_of(base, rules, policy, judged=judge_all), []
    merged = merge(base, files)
    before = tree_of(base, rules, policy, judged=[])
    return compare(before, tree_of(merged, rules, policy,
                                   judged=files if judge_all is None else [])), []


def run(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    if not (args.paths or args.filenames or args.kubeconfig or args.base):
        print("envelope quotas: give files (PATH or -f PATH), --kubeconfig, or both",
              file=sys.stderr)
        return 2
    tree, problems = sources(args, rules, policy)
    if tree is None:
        for problem in problems:
            print(f"envelope quotas: {problem}", file=sys.stderr)
        print(f"envelope quotas: {len(problems)} input problem(s); nothing was drawn", file=sys.stderr)
        return 2
    if args.output == "json":
        sys.stdout.write(orjson.dumps(as_json(tree), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    if args.output == "text":
        from app.quotaview.text import render_text

        sys.stdout.write(render_text(tree, args.resource, _width(args), _color(args.color)))
        return 0
    from app.quotaview.html import DEFAULT_COLLAPSE, render_html

    page = render_html(tree, DEFAULT_COLLAPSE if args.collapse_above is None else args.collapse_above)
    sys.stdout.write(page)
    if args.screenshot:
        from app.quotaview.browser import BrowserError, screenshot

        try:
            screenshot(page, Path(args.screenshot))
        except BrowserError as exc:
            print(f"envelope quotas: no screenshot: {exc}", file=sys.stderr)
            return 2
    return 0
