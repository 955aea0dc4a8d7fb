"""Numbers and claims in the texts that derive from the code (issue 35, point 6): each is
read from where it is decided, so a change there fails here until the text follows.

- the review body limit (``httplimits.MAX_BODY``) the README states, and its 413;
- the control plane's first build time the README states, from the per-binary times
  docs/testing.md records (build.sh writes them to ``build-times.log``), and the binaries
  build.sh builds;
- Kubernetes versions: any patch version that is not one of e2e/controlplane/versions.env
  must say it is history (``then``, ``measured``, ``ported``, a date ...);
- the failure policy NOTES.txt prints: what the chart writes (Ignore until a replica is
  ready with ``webhooks.safeInstall``), rendered by helm through NOTES' own template.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from app.serve.httplimits import MAX_BODY, MIB
from tests.helpers.chart import CHART, helm

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_states_the_body_limit_the_server_has() -> None:
    mib = MAX_BODY / MIB
    assert mib == int(mib)
    [stated] = re.findall(r"Bodies over\s+(\d+) MiB \(`--max-body-bytes`[^)]*\) get 413", README)
    assert int(stated) == int(mib), f"README says {stated} MiB, httplimits.MAX_BODY is {mib:g} MiB"


def test_readme_build_time_is_the_recorded_one() -> None:
    testing = (ROOT / "docs" / "testing.md").read_text()
    [times] = re.findall(r"Times measured on [^:]+:\s*(.*?)— about (\d+) minutes", testing, re.S)
    seconds = [int(s) for s in re.findall(r"~?(\d+) s\b", times[0])]
    built = re.findall(r"(?m)^ensure ([\w-]+) build_", (ROOT / "e2e/controlplane/build.sh").read_text())
    assert len(seconds) == len(built) == 6, (seconds, built)
    assert round(sum(seconds) / 60) == int(times[1])
    [low, high] = re.findall(r"from upstream Go modules \(needs Go; (\d+)–(\d+) minutes measured", README)[0]
    assert int(low) == round(sum(seconds) / 60) and int(high) > int(low)
    for name in built:  # the README names every binary build.sh builds
        assert name in README.split("from upstream Go modules")[0], name
    assert f"{low}–{high} minutes" in testing


_VERSION = re.compile(r"(?<![\w.])v?(1\.[2-9]\d\.\d+)(?![\w.-])")
_HISTORY = re.compile(r"\b(then|ported|port of|measured|was|were|moved|before|as in|oldest)\b"
                      r"|20\d\d-\d\d-\d\d", re.I)


def test_no_stale_kubernetes_version_is_stated_as_current() -> None:
    env = (ROOT / "e2e" / "controlplane" / "versions.env").read_text()
    current = set(re.findall(r"(?m)^\w+_VERSION=v?(\d+\.\d+\.\d+)", env))
    assert len(current) >= 2, current
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "app").rglob("*.py"),
             *(p for p in CHART.rglob("*") if p.suffix in (".yaml", ".txt", ".md", ".tpl"))]
    stale = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for version in _VERSION.findall(line):
                if version not in current and not _HISTORY.search(line):
                    stale.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert stale == [], ("versions that are not e2e/controlplane/versions.env's, stated as current "
                         "(say it is history, e.g. 'measured then', or use the current one):\n"
                         + "\n".join(stale))


def test_the_version_check_can_fail() -> None:
    assert _VERSION.findall("the e2e control plane (v1.34.12)") == ["1.34.12"]
    assert not _HISTORY.search("on a real kube-apiserver v1.34.12 and checks")
    assert _HISTORY.search("v1.34.12 (measured then)")


def _notes(tmp_path: Path, *values: str) -> str:
    """NOTES.txt rendered by helm with the chart's own helpers (helm template leaves NOTES
    out): the same text, through ``tpl`` in a ConfigMap of a copy of the chart."""
    chart = tmp_path / "envelope"
    shutil.copytree(CHART, chart)
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}}\n')
    out = helm("template", "envelope", str(chart), "--set", "image.local=true", *values,
               "--show-only", "templates/zz-notes.yaml").stdout
    return str(yaml.safe_load(out)["data"]["notes"])


def _policies(*values: str) -> dict[str, str]:
    out = helm("template", "envelope", str(CHART), "--set", "image.local=true", *values).stdout
    return {h["name"]: h["failurePolicy"] for d in yaml.safe_load_all(out) if d
            and d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
            for h in d["webhooks"]}


def test_notes_say_the_failure_policies_as_installed(tmp_path: Path) -> None:
    """Before: NOTES said the validating webhook is Fail, where the chart installs it as
    Ignore until a replica is ready (webhooks.safeInstall)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["webhooks"]["workloads"]
    installed = _policies()
    assert installed["workloads.validate.envelope.io"] == "Ignore"
    notes = _notes(tmp_path)
    assert (f"validate: Ignore until a replica is ready, then {values['validate']['failurePolicy']}"
            in notes), notes[:400]
    assert "mutate: Ignore" in notes and "mutate: Ignore until" not in notes
    direct = _notes(tmp_path / "direct", "--set", "webhooks.safeInstall=false")
    assert _policies("--set", "webhooks.safeInstall=false")["workloads.validate.envelope.io"] == "Fail"
    assert "validate: Fail)" in direct and "until a replica" not in direct
