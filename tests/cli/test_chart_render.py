"""``envelope check`` on a Helm chart directory (app/cli/chart_render.py), ``--quiet``.

Before (issue 35): ``envelope check charts/envelope`` skipped the templates and exited 0
having judged 2 objects. Now the chart is rendered with helm (the e2e control plane's,
tests/helpers/chart.py) and every rendered object judged; without helm, exit 2 saying how.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.chart import CHART, REPO, bin_dir

DEPLOY = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-web
spec:
  template:
    spec:
      containers:
      - name: web
        image: nginx
        resources:
          requests: {memory: {{ .Values.request | quote }}}
          limits: {memory: {{ .Values.limit | quote }}}
"""
CONFIGMAP = ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n"
             "data: {a: '1'}\n")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "check", *args], text=True, capture_output=True,
                          timeout=180, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)})


def _no_helm_env(tmp_path: Path) -> dict[str, str]:
    """PATH with python only: no helm anywhere, nothing pointing at one."""
    bin_ = tmp_path / "nohelm-bin"
    bin_.mkdir(exist_ok=True)
    return {k: v for k, v in os.environ.items()
            if k not in ("ENVELOPE_HELM", "ENVELOPE_CONTROLPLANE_BIN")} | {"PATH": str(bin_)}


def _with_helm() -> dict[str, str]:
    return {**os.environ, "ENVELOPE_HELM": str(bin_dir() / "helm")}


def _chart(root: Path, request: str = "512Mi", limit: str = "1Gi", *, sub: bool = False) -> Path:
    chart = root / "app"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: app\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text(f"request: {request}\nlimit: {limit}\n")
    (chart / "templates" / "deploy.yaml").write_text(DEPLOY)
    (chart / "templates" / "settings.yaml").write_text(CONFIGMAP)
    if sub:
        inner = chart / "charts" / "cache"
        (inner / "templates").mkdir(parents=True)
        (inner / "Chart.yaml").write_text("apiVersion: v2\nname: cache\nversion: 0.1.0\n")
        (inner / "templates" / "cm.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cache\n")
    return chart


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode in (0, 1), proc.stderr
    return dict(json.loads(proc.stdout))


# -- without helm ---------------------------------------------------------------------------

def test_a_chart_without_helm_exits_2_saying_how(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    out = _run(str(chart), env=_no_helm_env(tmp_path))
    assert out.returncode == 2, out
    assert f"{chart} is a Helm chart and rendering needs helm (no helm on PATH, $ENVELOPE_HELM unset)" \
        in out.stderr
    assert "set $ENVELOPE_HELM=/path/to/helm" in out.stderr and "| envelope check -f -" in out.stderr
    assert out.stdout == ""


def test_a_helm_that_is_not_executable_is_named(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    out = _run(str(chart), env={**_no_helm_env(tmp_path), "ENVELOPE_HELM": str(tmp_path / "nope")})
    assert out.returncode == 2
    assert f"$ENVELOPE_HELM={tmp_path / 'nope'} is not an executable" in out.stderr


def test_a_chart_left_out_with_exclude_needs_no_helm(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    (tmp_path / "plain.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    out = _run(str(tmp_path), "--exclude", "app", env=_no_helm_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert chart.name not in out.stdout.split("1 objects")[0]


# -- --quiet --------------------------------------------------------------------------------

def test_quiet_drops_the_not_evaluated_lines_in_every_format(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: a}\n"
                    "spec:\n  template:\n    spec:\n      containers: [{name: c, image: x, resources: "
                    "{requests: {memory: 1Gi}, limits: {memory: 1Gi}}}]\n")
    env = dict(os.environ)
    loud, quiet = _run(str(path), env=env), _run("--quiet", str(path), env=env)
    assert loud.returncode == quiet.returncode == 0
    assert len(re.findall(r"(?m)^not evaluated: ", loud.stdout)) >= 3
    assert "not evaluated" not in quiet.stdout
    assert quiet.stdout.splitlines()[-1] == loud.stdout.splitlines()[-1] == \
        "1 objects: 0 errors, 0 warnings, 0 would be mutated"
    assert _json(_run("-o", "json", str(path), env=env))["notEvaluated"]
    assert _json(_run("-o", "json", "--quiet", str(path), env=env))["notEvaluated"] == []
    for fmt in ("github", "junit", "sarif"):  # the rule texts in SARIF may say "not evaluated"
        assert "could not judge" in _run("-o", fmt, str(path), env=env).stdout, fmt
        assert "could not judge" not in _run("-o", fmt, "--quiet", str(path), env=env).stdout, fmt


# -- with helm ------------------------------------------------------------------------------

def test_a_chart_is_rendered_and_judged_at_its_templates(tmp_path: Path) -> None:
    chart = _chart(tmp_path, sub=True)
    (chart / "crds").mkdir()
    (chart / "crds" / "crd.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: ws.x.io}\n"
        "spec: {group: x.io, names: {kind: W, plural: ws}, scope: Namespaced, versions: []}\n")
    (chart / "files").mkdir()
    (chart / "files" / "extra.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    report = _json(_run(str(chart), "-o", "json", "--helm-release", "shop", "--helm-namespace", "team",
                        env=_with_helm()))
    objects = {(o["kind"], o["name"]): o for o in report["objects"]}
    # the subchart is rendered once, by its parent
    assert sorted(objects) == [("ConfigMap", "shop-cache"), ("ConfigMap", "shop-settings"),  # crds/ as files
                               ("CustomResourceDefinition", "ws.x.io"), ("Deployment", "shop-web")]
    web = objects[("Deployment", "shop-web")]
    assert web["file"] == str(chart / "templates" / "deploy.yaml")
    assert web["line"] == 2  # the template's `kind: Deployment` line
    assert objects[("ConfigMap", "shop-cache")]["file"] == str(chart / "charts" / "cache" / "templates"
                                                                / "cm.yaml")
    [finding] = [f for f in web["findings"] if f["severity"] == "error"]
    assert finding["rule"] == "memory-request-equals-limit"
    assert web["namespace"] == "default" and len(report["objects"]) == 4  # placed as kubectl -n places it


def test_values_files_and_sets_reach_helm(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    env = _with_helm()
    assert _run(str(chart), env=env).returncode == 1  # 512Mi under a 1Gi limit
    values = tmp_path / "prod.yaml"
    values.write_text("request: 1Gi\n")
    assert _run(str(chart), "--helm-values", str(values), env=env).returncode == 0
    assert _run(str(chart), "--helm-set", "request=1Gi", env=env).returncode == 0
    assert _run(str(chart), "--helm-values", str(values), "--helm-set", "limit=2Gi", env=env).returncode == 1


def test_a_template_helm_cannot_render_exits_2_with_helms_message(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    (chart / "templates" / "broken.yaml").write_text("kind: {{ .Values.missing.field }}\n")
    out = _run(str(chart), env=_with_helm())
    assert out.returncode == 2
    assert "helm template failed (exit 1)" in out.stderr and "broken.yaml" in out.stderr


def test_envelope_s_own_chart_is_judged_whole(tmp_path: Path) -> None:
    """The issue's case: `envelope check charts/envelope` judged 2 objects (the CRDs in its
    files/, read as plain files); now every object helm renders, and only those."""
    rendered = subprocess.run([str(bin_dir() / "helm"), "template", "release-name", str(CHART),
                               "--set", "image.local=true"], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    expected = [d for d in yaml.safe_load_all(rendered) if d]
    report = _json(_run("charts/envelope", "-o", "json", "--helm-set", "image.local=true",
                        env=_with_helm()))
    assert sorted((o["kind"], o["name"]) for o in report["objects"]) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in expected)
    assert len(expected) > 10
    assert all(o["file"].startswith("charts/envelope/templates/") for o in report["objects"])
    assert not [s for s in report["skipped"] if s["path"].endswith("templates")]
    # files/crds/ (installed by a template only when enabled) is not judged as plain files
    assert any(s["path"].startswith("charts/envelope/files/crds/") for s in report["skipped"])


def test_find_helm_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli.chart_render import find_helm

    fake = tmp_path / "bin" / "helm"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("ENVELOPE_HELM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("ENVELOPE_CONTROLPLANE_BIN", str(fake.parent))
    assert find_helm() == str(fake)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert find_helm() == shutil.which("helm")
    monkeypatch.setenv("ENVELOPE_HELM", "/nonexistent/helm")
    assert find_helm() is None
