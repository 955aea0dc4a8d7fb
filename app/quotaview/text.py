"""The quota tree for a terminal: one line per pool and queue (wrapped at ``width``) and a
bar under each parent, divided between its children, the part beyond the parent's
cards or guarantee drawn ``!`` (red in colour).

Bars are ASCII (``#`` and ``=`` alternate between children, ``.`` is room left, ``!`` is
over-commit), so the output is the same in any terminal and in a CI log; colour (ANSI)
only adds emphasis.
"""

from __future__ import annotations

import textwrap
from decimal import ROUND_HALF_EVEN, Decimal

from app.crds.kai import UNLIMITED, ZERO, Resource, describe, shortfall
from app.k8s.util import plain_number
from app.quotaview.model import Numbers, Pool, Tree, TreeNode

__all__ = ["MIN_WIDTH", "bar", "render_text"]

MIN_WIDTH = 40
SEGMENT = "#="
ROOM, OVER = ".", "!"
_ANSI = {"seg0": "36", "seg1": "34", "over": "1;31", "room": "2", "head": "1", "warn": "33",
         "changed": "35"}


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, what: str) -> str:
        if not self.color or not text:
            return text
        return f"\x1b[{_ANSI[what]}m{text}\x1b[0m"


def _cells(amount: Decimal, scale: Decimal, width: int) -> int:
    return int((amount * width / scale).to_integral_value(ROUND_HALF_EVEN))


def bar(parts: list[Decimal], cap: Decimal | None, width: int, style: _Style | None = None) -> str:
    """``[##==##..]``: ``parts`` side by side against ``cap`` (None or -1: no cap, the bar
    is the parts' sum), cells past the cap drawn ``!``. A part that is unlimited fills the
    bar with ``!`` when the cap is finite."""
    paint = style or _Style(False)
    width = max(width, 1)
    if any(p == UNLIMITED for p in parts):
        body = OVER * width if cap is not None and cap != UNLIMITED else "#" * width
        return f"[{paint(body, 'over' if OVER in body else 'seg0')}]"
    summed = sum(parts, ZERO)
    finite_cap = cap is not None and cap != UNLIMITED
    scale = max(summed, cap if finite_cap and cap is not None else ZERO)
    if scale <= 0:
        return f"[{paint(ROOM * width, 'room')}]"
    cap_at = _cells(cap, scale, width) if finite_cap and cap is not None else width
    cells: list[tuple[str, str]] = []
    running = ZERO
    start = 0
    for i, part in enumerate(parts):
        running += part
        end = _cells(running, scale, width)
        for cell in range(start, end):
            over = cell >= cap_at
            cells.append((OVER if over else SEGMENT[i % 2], "over" if over else f"seg{i % 2}"))
        start = max(start, end)
    cells.extend((ROOM, "room") for _ in range(len(cells), width))
    out, run, kind = [], "", ""
    for char, what in cells:
        if what != kind and run:
            out.append(paint(run, kind))
            run = ""
        run, kind = run + char, what
    out.append(paint(run, kind))
    return "[" + "".join(out) + "]"


def _fraction(used: Decimal, cap: Decimal | None) -> str:
    shown_used = "unlimited" if used == UNLIMITED else plain_number(used)
    if cap is None:
        return f" {shown_used}"
    return f" {shown_used}/{'unlimited' if cap == UNLIMITED else plain_number(cap)}"


class _Writer:
    def __init__(self, tree: Tree, resource: Resource, width: int, color: bool) -> None:
        self.tree = tree
        self.r = resource
        self.width = max(width, MIN_WIDTH)
        self.style = _Style(color)
        self.lines: list[str] = []
        self.unreported = 0

    def say(self, text: str, indent: int, what: str = "") -> None:
        pad = " " * indent
        for line in textwrap.wrap(text, self.width - indent, break_long_words=True,
                                  break_on_hyphens=False, subsequent_indent="    "):
            self.lines.append(pad + (self.style(line, what) if what else line))

    def draw(self, parts: list[Decimal], cap: Decimal | None, indent: int) -> None:
        used = UNLIMITED if any(p == UNLIMITED for p in parts) else sum(parts, ZERO)
        if used == 0 and (cap is None or cap in (ZERO, UNLIMITED)):
            return  # nothing to draw
        suffix = _fraction(used, cap)
        room = max(self.width - indent - 2 - len(suffix), 10)
        self.lines.append(" " * indent + bar(parts, cap, room, self.style) + suffix)

    def numbers(self, n: Numbers, before: Numbers | None, guarantee: str) -> str:
        def changed(now: Decimal, then: Decimal | None) -> str:
            text = describe(self.r, now)
            return text if then is None or then == now else f"{describe(self.r, then)} -> {text}"

        limit = changed(n.limit, before.limit if before else None)
        facts = [f"{guarantee} {changed(n.guarantee, before.guarantee if before else None)}",
                 f"limit {limit}" + ("" if n.limit_set else " (left out)")]
        return ", ".join(facts)

    def node(self, node: TreeNode, indent: int, label: str) -> None:
        n = node.numbers[self.r]
        before = node.before[self.r] if node.before else None
        guarantee = "quota" if node.kind == "Queue" else "deserved"
        text = f"{label} {node.name}"
        if node.queue not in (node.name, f"{node.name}-{node.pool}"):  # not KRM's derived name
            text += f" (queue {node.queue})"
        text += ": " + self.numbers(n, before, guarantee)
        if n.held is not None:
            text += f", {'projects' if node.kind == 'Department' else 'children'} {describe(self.r, n.held)}"
        if n.allocated is not None:
            text += f", allocated {describe(self.r, n.allocated)}"
        else:
            self.unreported += 1
        if node.change:
            text += f" [{node.change}]"
        if n.over and n.held is not None:
            text += f" - OVER-COMMITTED by {describe(self.r, shortfall(n.held, n.guarantee))}"
        self.say(text, indent, "over" if n.over else ("changed" if node.change else ""))
        if node.children:
            self.draw([c.numbers[self.r].guarantee for c in node.children], n.guarantee, indent)
        self.findings(node.findings, indent + 2)
        for child in node.children:
            self.node(child, indent + 2, "project" if child.kind == "Project" else "queue")

    def findings(self, found: list[dict[str, str]], indent: int) -> None:
        for f in found:
            self.say(f"{f['severity']} {f['rule']}: {f['message']}", indent,
                     "over" if f["severity"] == "error" else "warn")

    def pool(self, pool: Pool) -> None:
        r = self.r
        text = f"pool {pool.name}"
        if not pool.declared:
            text += " (not declared)" if pool.name != "default" else " (built in)"
        if r == "gpu":
            capacity = (f"{pool.nodes} node{'s' if pool.nodes != 1 else ''}, "
                        f"{describe('gpu', pool.cards)}") if pool.cards > 0 else \
                "capacity unknown (no GPU nodes in view)"
            if pool.before and pool.before[0] != pool.cards:
                capacity += f" (was {describe('gpu', pool.before[0])})"
            guaranteed = describe(r, pool.guaranteed[r])
            if pool.before and pool.before[1] != pool.guaranteed[r]:
                guaranteed = f"{describe(r, pool.before[1])} -> {guaranteed}"
            text += f": {capacity}; departments guaranteed {guaranteed}"
        else:
            text += f": departments guaranteed {describe(r, pool.guaranteed[r])}"
        if pool.change == "added":
            text += " [added]"
        over = r == "gpu" and pool.over
        if over:
            text += f" - OVER-COMMITTED by {describe(r, shortfall(pool.guaranteed[r], pool.cards))}"
        self.say(text, 0, "over" if over else "head")
        if pool.departments:
            cap = pool.cards if r == "gpu" and pool.cards > 0 else None
            self.draw([d.numbers[r].guarantee for d in pool.departments], cap, 0)
        self.findings(pool.findings, 2)
        for department in pool.departments:
            self.node(department, 2, "department")
        for project in pool.uncapped:
            self.node(project, 2, "project (no department queue on this pool)")

    def render(self) -> str:
        for i, pool in enumerate(self.tree.pools):
            if i:
                self.lines.append("")
            self.pool(pool)
        if self.tree.queues:
            if self.lines:
                self.lines.append("")
            self.say("KAI queues (not managed by KRM)", 0, "head")
            for root in self.tree.queues:
                self.node(root, 2, "queue")
        if self.tree.loose:
            self.lines.append("")
            self.say("not in the tree (their specs do not give queues)", 0, "head")
            for node in self.tree.loose:
                self.say(f"{node.kind} {node.name}", 2)
                self.findings(node.findings, 4)
        if self.tree.removed:
            self.lines.append("")
            self.say("removed by this change", 0, "head")
            for gone in self.tree.removed:
                where = f" (pool {gone['pool']})" if gone["pool"] else ""
                self.say(f"{gone['kind'].lower()} {gone['name']} queue {gone['queue']}{where}", 2,
                         "changed")
        if not self.lines:
            self.lines.append("no quota objects (NodePool, Department, Project, Queue) found")
        elif self.unreported:
            self.lines.append("")
            self.say(f"allocated: not reported for {self.unreported} queue"
                     f"{'s' if self.unreported != 1 else ''} (no KAI Queue status.allocated in view)", 0)
        return "\n".join(self.lines) + "\n"


def render_text(tree: Tree, resource: Resource = "gpu", width: int = 100, color: bool = False) -> str:
    return _Writer(tree, resource, width, color).render()
