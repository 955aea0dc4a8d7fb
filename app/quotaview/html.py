"""The quota tree as one self-contained HTML page: inline CSS, inline SVG bars, no script,
nothing fetched. Pools and departments are ``<details>`` (collapse with no script);
beyond ``collapse_above`` projects, departments start closed except those with findings,
over-commit or a change under review, so a 10,000-project page opens on what matters.

Every pool, department, project and queue carries ``data-kind``, ``data-name`` and
``data-over`` (``true`` when over-committed), which the browser test reads.
"""

from __future__ import annotations

from decimal import Decimal
from html import escape

from app.crds.kai import RESOURCES, UNLIMITED, ZERO, Resource, describe, shortfall
from app.k8s.util import plain_number
from app.quotaview.model import Numbers, Pool, Tree, TreeNode

__all__ = ["DEFAULT_COLLAPSE", "render_html"]

DEFAULT_COLLAPSE = 200
"""Projects on a page above which departments start collapsed."""

BAR_W = 1000
CSS = """
body{font:14px/1.4 system-ui,"DejaVu Sans",sans-serif;margin:1.5em;color:#1d2330;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{display:inline;font-size:1.15em}
.summary{color:#445}.pool{border:1px solid #ccd3e0;border-radius:6px;padding:.4em .8em;margin:1em 0}
.pool.over{border-color:#c62828;border-width:2px}
summary{cursor:pointer}.dept{margin:.5em 0 .5em 1.2em}.dept>details>summary{font-weight:600}
.badge{display:inline-block;border-radius:3px;padding:0 .4em;margin-left:.4em;font-size:.85em;font-weight:600}
.badge.over{background:#c62828;color:#fff}.badge.changed{background:#6a1b9a;color:#fff}
.badge.added{background:#2e7d32;color:#fff}.badge.uncapped{background:#ef6c00;color:#fff}
svg.bar{display:block;width:100%;max-width:70em;height:18px;margin:.3em 0}
table{border-collapse:collapse;margin:.3em 0 .3em 1.2em;font-size:.92em}
td,th{padding:.1em .6em;text-align:right;border-bottom:1px solid #eef}th{color:#556;font-weight:600}
td:first-child,th:first-child{text-align:left;white-space:nowrap}tr.over td{background:#fde7e7}
tr.changed td{background:#f3e5f5}.num{white-space:nowrap}.was{color:#888}
ul.findings{margin:.2em 0 .2em 1.2em;padding-left:1em}ul.findings li.error{color:#b71c1c}
ul.findings li.warning{color:#8a5a00}.rule{font-family:monospace;font-weight:600}
.legend span{display:inline-block;width:.9em;height:.9em;vertical-align:middle;margin:0 .3em 0 .8em}
"""
SEGMENTS = ("#3f6fb5", "#8fb3e6")
OVER_FILL = "#d32f2f"


def _num(resource: Resource, value: Decimal | None) -> str:
    return "not reported" if value is None else describe(resource, value)


def _attrs(kind: str, name: str, over: bool, change: str) -> str:
    return (f' data-kind="{escape(kind)}" data-name="{escape(name)}" data-over="{str(over).lower()}"'
            + (f' data-change="{change}"' if change else ""))


def _bar(parts: list[tuple[str, Decimal]], cap: Decimal | None, what: str) -> str:
    """Children side by side against the parent's cap; the part past the cap red."""
    if not parts:
        return ""
    if any(v == UNLIMITED for _, v in parts):
        unlimited = ", ".join(escape(n) for n, v in parts if v == UNLIMITED)
        fill = OVER_FILL if cap is not None and cap != UNLIMITED else SEGMENTS[0]
        return (f'<svg class="bar" viewBox="0 0 {BAR_W} 18" preserveAspectRatio="none" role="img">'
                f'<title>unlimited guarantee: {unlimited}</title>'
                f'<rect width="{BAR_W}" height="18" fill="{fill}"/></svg>')
    summed = sum((v for _, v in parts), ZERO)
    finite = cap is not None and cap != UNLIMITED
    scale = max(summed, cap if finite and cap is not None else ZERO)
    if scale <= 0:
        return ""
    out = [f'<svg class="bar" viewBox="0 0 {BAR_W} 18" preserveAspectRatio="none" role="img">'
           f'<title>{escape(what)}</title><rect width="{BAR_W}" height="18" fill="#eef1f6"/>']
    x = ZERO
    for i, (name, value) in enumerate(parts):
        if value <= 0:
            continue
        w = value * BAR_W / scale
        out.append(f'<rect x="{float(x):.2f}" width="{float(w):.2f}" height="18" '
                   f'fill="{SEGMENTS[i % 2]}"><title>{escape(name)}: {escape(plain_number(value))}'
                   f'</title></rect>')
        x += w
    if finite and cap is not None and summed > cap:
        start = cap * BAR_W / scale
        out.append(f'<rect class="overflow" x="{float(start):.2f}" width="{float(BAR_W - start):.2f}" '
                   f'height="18" fill="{OVER_FILL}" opacity="0.85"><title>over by '
                   f'{escape(plain_number(summed - cap))}</title></rect>')
    if finite and cap is not None:
        at = float(cap * BAR_W / scale)
        out.append(f'<line x1="{at:.2f}" x2="{at:.2f}" y1="0" y2="18" stroke="#1d2330" stroke-width="3"/>')
    out.append("</svg>")
    return "".join(out)


def _findings(found: list[dict[str, str]]) -> str:
    if not found:
        return ""
    items = "".join(f'<li class="{escape(f["severity"])}">{escape(f["severity"])} '
                    f'<span class="rule">{escape(f["rule"])}</span>: {escape(f["message"])}</li>'
                    for f in found)
    return f'<ul class="findings">{items}</ul>'


def _cell(resource: Resource, now: Decimal | None, then: Decimal | None) -> str:
    text = escape(_num(resource, now))
    if then is not None and then != now:
        text = f'<span class="was">{escape(_num(resource, then))}</span> &rarr; {text}'
    return f'<td class="num">{text}</td>'


def _cells(node: TreeNode) -> str:
    out = []
    for r in RESOURCES:
        n: Numbers = node.numbers[r]
        b = node.before[r] if node.before else None
        out.append(_cell(r, n.guarantee, b.guarantee if b else None))
        out.append(_cell(r, n.limit, b.limit if b else None))
        if r == "gpu":
            out.append(_cell(r, n.held, None) if n.held is not None else '<td class="num">-</td>')
        out.append(_cell(r, n.allocated, None))
    return "".join(out)


HEAD = ("<tr><th>{label}</th><th>gpu guarantee</th><th>gpu limit</th><th>children</th>"
        "<th>gpu allocated</th><th>cpu guarantee</th><th>cpu limit</th><th>cpu allocated</th>"
        "<th>memory guarantee</th><th>memory limit</th><th>memory allocated</th></tr>")


def _badges(over: bool, change: str, extra: str = "") -> str:
    out = ' <span class="badge over">over-committed</span>' if over else ""
    if change:
        out += f' <span class="badge {change}">{change}</span>'
    return out + extra


def _rows(nodes: list[TreeNode], label: str, depth: int = 0) -> str:
    rows = []
    for node in nodes:
        classes = " ".join(c for c in ("over" if node.over else "", "changed" if node.change else "") if c)
        name = ("&nbsp;" * 3 * depth) + escape(node.name)
        if node.queue not in (node.name, f"{node.name}-{node.pool}"):
            name += f' <span class="was">queue {escape(node.queue)}</span>'
        rows.append(f'<tr class="node {classes}"{_attrs(node.kind, node.name, node.over, node.change)}>'
                    f'<td>{name}{_badges(node.over, node.change)}</td>{_cells(node)}</tr>')
        if node.findings:
            rows.append(f'<tr><td colspan="11">{_findings(node.findings)}</td></tr>')
        rows.append(_rows(node.children, label, depth + 1))
    return "".join(rows)


def _table(nodes: list[TreeNode], label: str) -> str:
    if not nodes:
        return ""
    return f"<table>{HEAD.format(label=label)}{_rows(nodes, label)}</table>"


def _parent(node: TreeNode, label: str, child_label: str, collapsed: bool) -> str:
    n = node.numbers["gpu"]
    held = f", {child_label}s {_num('gpu', n.held)}" if n.held is not None else ""
    before = node.before["gpu"] if node.before else None
    was = (f' <span class="was">(was {escape(_num("gpu", before.guarantee))})</span>'
           if before and before.guarantee != n.guarantee else "")
    summary = (f"{label} {escape(node.name)}: guarantee {escape(_num('gpu', n.guarantee))}{was}, "
               f"limit {escape(_num('gpu', n.limit))}{escape(held)}"
               f"{_badges(node.over, node.change)}")
    keep_open = not collapsed or node.over or node.findings or node.change or any(
        c.findings or c.over or c.change for c in node.children)
    bar = _bar([(c.name, c.numbers["gpu"].guarantee) for c in node.children], n.guarantee,
               f"{child_label}s' gpu guarantees against {node.name}'s")
    return (f'<div class="dept{" over" if node.over else ""}"'
            f'{_attrs(node.kind, node.name, node.over, node.change)}>'
            f'<details{" open" if keep_open else ""}><summary>{summary}</summary>{bar}'
            f'{_findings(node.findings)}{_table(node.children, child_label)}</details></div>')


def _pool(pool: Pool, collapsed: bool) -> str:
    g = pool.guaranteed["gpu"]
    capacity = (f"{pool.nodes} node{'s' if pool.nodes != 1 else ''}, {describe('gpu', pool.cards)}"
                if pool.cards > 0 else "capacity unknown (no GPU nodes in view)")
    gap = describe("gpu", shortfall(g, pool.cards))
    over = f' <span class="badge over">over-committed by {escape(gap)}</span>' if pool.over else ""
    was = ""
    if pool.before:
        was = (f' <span class="was">(before: {escape(describe("gpu", pool.before[0]))}, guaranteed '
               f'{escape(describe("gpu", pool.before[1]))})</span>')
    change = f' <span class="badge {pool.change}">{pool.change}</span>' if pool.change else ""
    bar = _bar([(d.name, d.numbers["gpu"].guarantee) for d in pool.departments],
               pool.cards if pool.cards > 0 else None, "departments' gpu guarantees against the pool's cards")
    departments = "".join(_parent(d, "department", "project", collapsed) for d in pool.departments)
    uncapped = ""
    if pool.uncapped:
        uncapped = ('<div class="dept"><details open><summary>projects no department queue caps on '
                    f'this pool <span class="badge uncapped">uncapped</span></summary>'
                    f'{_table(pool.uncapped, "project")}</details></div>')
    return (f'<section class="pool{" over" if pool.over else ""}" id="pool-{escape(pool.name)}"'
            f'{_attrs("pool", pool.name, pool.over, pool.change)}><details open><summary>'
            f'<h2>pool {escape(pool.name)}</h2> {escape(capacity)}; departments guaranteed '
            f'{escape(describe("gpu", g))}, cpu {escape(describe("cpu", pool.guaranteed["cpu"]))}, '
            f'memory {escape(describe("memory", pool.guaranteed["memory"]))}{was}{over}{change}</summary>'
            f'{bar}{_findings(pool.findings)}{departments}{uncapped}</details></section>')


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _summary(tree: Tree) -> str:
    nodes = list(tree.every_node())
    departments = sum(1 for n in nodes if n.kind == "Department")
    projects = len({n.name for n in nodes if n.kind == "Project"})
    queues = sum(1 for root in tree.queues for _ in root.walk())
    over = sum(1 for p in tree.pools if p.over) + sum(1 for n in nodes if n.over)
    found = [f for n in nodes for f in n.findings] + [f for p in tree.pools for f in p.findings]
    errors = sum(1 for f in found if f["severity"] == "error")
    changed = sum(1 for n in nodes if n.change)
    text = (f"{_count(len(tree.pools), 'pool')}, {_count(departments, 'department queue')}, "
            f"{_count(projects, 'project')}, {_count(queues, 'KAI queue')}; <strong>{over} "
            f"over-committed</strong>; {_count(errors, 'error')} and "
            f"{_count(len(found) - errors, 'warning')} from the quota rules")
    if tree.reviewing:
        text += (f"; this change adds, changes or moves {_count(changed, 'queue')} and removes "
                 f"{len(tree.removed)}")
    return f'<p class="summary">{text}.</p>'


def render_html(tree: Tree, collapse_above: int = DEFAULT_COLLAPSE) -> str:
    projects = sum(1 for n in tree.every_node() if n.kind == "Project")
    collapsed = projects > collapse_above
    body = [f"<h1>KAI quota trees{' (change under review)' if tree.reviewing else ''}</h1>",
            _summary(tree),
            '<p class="legend">bars: children\'s gpu guarantees side by side<span style="background:'
            f'{SEGMENTS[0]}"></span><span style="background:{SEGMENTS[1]}"></span>, the parent\'s '
            f'cards or guarantee at the black line, past it<span style="background:{OVER_FILL}">'
            "</span>over-committed</p>"]
    body.extend(_pool(p, collapsed) for p in tree.pools)
    if tree.queues:
        body.append('<section class="pool" id="kai-queues"><details open><summary><h2>KAI queues'
                    "</h2> not managed by KRM</summary>")
        body.extend(_parent(q, "queue", "child queue", collapsed) if q.children else
                    _table([q], "queue") for q in tree.queues)
        body.append("</details></section>")
    if tree.loose:
        body.append('<section class="pool" id="unplaced"><h2>not in the tree</h2>')
        body.extend(f'<div class="dept"{_attrs(n.kind, n.name, False, "")}>{escape(n.kind)} '
                    f"{escape(n.name)}{_findings(n.findings)}</div>" for n in tree.loose)
        body.append("</section>")
    if tree.removed:
        items = "".join(f'<li data-kind="{escape(g["kind"])}" data-name="{escape(g["name"])}" '
                        f'data-change="removed">{escape(g["kind"])} {escape(g["name"])} queue '
                        f'{escape(g["queue"])}{" on pool " + escape(g["pool"]) if g["pool"] else ""}</li>'
                        for g in tree.removed)
        body.append(f'<section class="pool" id="removed"><h2>removed by this change</h2><ul>{items}</ul>'
                    "</section>")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Envelope: KAI quota trees</title><style>{CSS}</style></head><body>"
            + "".join(body) + "</body></html>\n")
