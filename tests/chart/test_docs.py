"""The chart README (charts/envelope/README.md): its values table is what
``python -m app.chart.docs`` generates from values.schema.json and values.yaml, and every
link in it works from the packaged chart (absolute, into the repository, to a file that
exists)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from app.chart.docs import BEGIN, END, README, comments, main, render, rows, table

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "envelope"


def _schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def test_readme_values_table_is_current() -> None:
    current = README.read_text()
    wanted = render(current, _schema(), (CHART / "values.yaml").read_text())
    assert current == wanted, "charts/envelope/README.md is out of date: run python -m app.chart.docs --write"
    assert main(["--check"]) == 0


def test_check_fails_when_a_comment_changes(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    for name in ("README.md", "values.schema.json", "values.yaml"):
        (chart / name).write_text((CHART / name).read_text())
    values = (chart / "values.yaml").read_text()
    assert "# -- Webhook replicas." in values
    changed = values.replace("# -- Webhook replicas.", "# -- Replicas of the webhook.")
    (chart / "values.yaml").write_text(changed)
    assert main(["--chart", str(chart), "--check"]) == 1
    assert main(["--chart", str(chart), "--write"]) == 0
    assert "| `replicaCount` | integer | `3` | Replicas of the webhook." in (chart / "README.md").read_text()
    assert main(["--chart", str(chart), "--check"]) == 0


def test_every_value_has_a_row_with_its_default_and_a_description() -> None:
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    by_key = {r.key: r for r in rows(_schema(), values, comments(values_text))}

    def walk(node: dict, prefix: str = "") -> None:
        for key, value in node.items():
            path = prefix + key
            assert path in by_key, f"values.yaml {path} has no row"
            row = by_key[path]
            assert row.description, f"{path} has no description"
            if row.default == "" and isinstance(value, dict):  # an object with its own rows
                walk(value, path + ".")
            else:
                assert row.default, f"{path} has no default"

    walk(values)
    assert by_key["replicaCount"].default == "`3`"
    assert by_key["certificates.mode"].type == '"self" \\| "certManager" \\| "provided"'
    assert by_key["test.namespace"].default == '`"default"`'


def test_comments_follow_indentation_and_skip_lists() -> None:
    text = """# header, not attached
# to anything

# -- Top level,
# two lines.
top: 1
outer:
  # -- Inner.
  inner:
    - name: a
      # a comment inside a list item
      value: b
  # plain comment
  after: 2
# -- Last.
last: x
"""
    assert comments(text) == {"top": "Top level, two lines.", "outer.inner": "Inner.",
                              "outer.after": "plain comment", "last": "Last."}


def test_table_escapes_markdown() -> None:
    schema = {"properties": {"a": {"type": "string", "description": "x | y <base>/`<kept>`"}}}
    out = table(schema, "a: 'p|q'\n")
    assert "| `a` | string | `\"p\\|q\"` | x \\| y &lt;base&gt;/`<kept>` |" in out


def test_readme_has_one_generated_section() -> None:
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1


def test_chart_links_stay_in_the_repository_or_the_installers_hands() -> None:
    """No link to a domain or organisation the project does not control (issue 35: the
    chart's home, sources, NOTES and runbook_url named a GitHub organisation it does not
    own). The README links relatively to files that exist; NOTES.txt links only to the
    installer's ``links.docsBaseURL``; Chart.yaml names no home, sources or links."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links, "no links found"
    for link in links:
        assert not link.startswith(("http://", "https://")), f"absolute link {link}"
        if not link.startswith("#"):
            target = (CHART / link.split("#", 1)[0]).resolve()
            assert target.is_file(), f"{link}: {target} does not exist"
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "See docs/" not in notes and ".Chart.Home" not in notes
    assert '{{ trimSuffix "/" .Values.links.docsBaseURL }}/docs/troubleshooting.md' in notes
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert not {"home", "sources"} & set(chart), chart
    assert "artifacthub.io/links" not in chart["annotations"]
    for path in CHART.rglob("*"):
        if path.is_file() and "files" not in path.relative_to(CHART).parts:
            found = re.findall(r"https?://(?:www\.)?github\.com/[^\s)\"']+", path.read_text(errors="replace"))
            assert not found, f"{path.relative_to(ROOT)} links {found}"


def test_helm_package_holds_what_the_chart_needs(tmp_path: Path) -> None:
    import tarfile

    from tests.helpers.chart import helm

    helm("package", str(CHART), "--destination", str(tmp_path))
    [package] = tmp_path.glob("envelope-*.tgz")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert package.name == f"envelope-{version}.tgz"
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
        readme = tar.extractfile("envelope/README.md")
        assert readme is not None and readme.read().decode() == README.read_text()
    for wanted in ("Chart.yaml", "values.yaml", "values.schema.json", "README.md", "files/helm-test.py",
                   "templates/tests/dry-run.yaml", "templates/NOTES.txt", "dashboards/envelope.json"):
        assert f"envelope/{wanted}" in names, wanted
    assert any(n.startswith("envelope/files/crds/") for n in names)
    assert not [n for n in names if "/docs/" in n or n.endswith((".pyc", ".orig"))]


def test_artifacthub_images_name_the_default_image() -> None:
    from tests.helpers.chart import render

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert [i["image"] for i in images] == [render().container["image"]]
    assert chart["appVersion"] in images[0]["image"]
    changes = yaml.safe_load(chart["annotations"]["artifacthub.io/changes"])
    kinds = {"added", "changed", "deprecated", "removed", "fixed", "security"}
    assert changes and all(c["kind"] in kinds and c["description"] for c in changes)
