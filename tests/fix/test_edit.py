"""``envelope fix`` from the command line: in place, --diff, --check, stdin, refusals."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.fix.edit import FixError, patch_text

DEPLOY = """\
# the web tier
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # owned by shop
  namespace: shop
spec:
  template:
    spec:
      containers:
        - name: app
          image: nginx
          resources:
            requests: {memory: 512Mi}
            limits:
              cpu:    "2"      # two cores
              memory: 512Mi
"""

FIXED = """\
# the web tier
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # owned by shop
  namespace: shop
  annotations:
    envelope.io/mutations: cpu-limits:app
spec:
  template:
    spec:
      containers:
        - name: app
          image: nginx
          resources:
            requests: {memory: 512Mi, cpu: "2"}
            limits:
              memory: 512Mi
"""


def test_fix_in_place_then_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deploy.yaml"
    f.write_text(DEPLOY)
    assert main(["fix", str(f)]) == 0
    assert f.read_text() == FIXED
    assert "1 object(s) changed" in capsys.readouterr().err
    assert main(["fix", "--check", str(f)]) == 0  # idempotent
    assert f.read_text() == FIXED
    assert "0 object(s) in 0 file(s) would change" in capsys.readouterr().err
    assert main(["check", "--fail-on", "change", str(f)]) == 0


def test_diff_and_check_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deploy.yaml"
    f.write_text(DEPLOY)
    assert main(["fix", "--diff", str(f)]) == 1
    out = capsys.readouterr().out
    assert '-              cpu:    "2"      # two cores\n' in out
    assert '+            requests: {memory: 512Mi, cpu: "2"}\n' in out
    assert main(["fix", "--check", str(f)]) == 1
    assert "1 object(s) would change" in capsys.readouterr().err
    assert f.read_text() == DEPLOY


def test_stdin_to_stdout(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(DEPLOY.encode())))
    assert main(["fix", "-"]) == 0
    assert capsys.readouterr().out == FIXED


def test_helm_template_refused_with_how(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deployment.yaml"
    text = DEPLOY.replace("name: web", "name: {{ .Release.Name }}-web")
    f.write_text(text)
    assert main(["fix", str(f)]) == 2
    err = capsys.readouterr().err
    assert "Helm template" in err and "values files" in err and "--post-renderer" in err
    assert f.read_text() == text


CHAT_TEMPLATE_CM = """\
---
# Source: vllm-stack/templates/chat-template.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: vllm-chat-template
data:
  chat_template.jinja: |-
    {% for message in messages %}{{'<|im_start|>' + message['role'] + message['content']}}{% endfor %}
  alert.tmpl: "{{ $labels.instance }} of {{ $labels.job }} is down"
  plain: value-{{x}}
"""


def test_rendered_output_with_templates_in_string_values_is_fixed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37 class 10: a real render holds '{{' in string values (vLLM's Jinja chat
    template, a bitnami chart's alert template): it reads as YAML, so it is fixed like any
    other stream; the ConfigMap stays byte for byte."""
    f = tmp_path / "render.yaml"
    f.write_text(CHAT_TEMPLATE_CM + "---\n" + DEPLOY)
    assert main(["fix", str(f)]) == 0, capsys.readouterr().err
    assert f.read_text() == CHAT_TEMPLATE_CM + "---\n" + FIXED


def test_a_template_on_stdin_is_refused_without_recommending_itself(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text = DEPLOY.replace("name: web", "name: {{ .Release.Name }}-web")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["fix", "-"]) == 2
    err = capsys.readouterr().err
    assert "does not read as YAML" in err and "rendered output" in err, err
    assert "| envelope fix -" not in err  # the command that just failed
    assert "not valid YAML" in err  # and what the reader found


def test_an_object_check_refuses_for_its_fields_is_not_patched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37 class 10: ``check`` refuses an object with an unknown field (strict field
    validation, kubectl's default): ``fix`` writes no patch into it and says why; the
    other objects are fixed."""
    f = tmp_path / "two.yaml"
    typo = DEPLOY.replace("name: web ", "name: typo ").replace("          resources:\n",
                                                               "          resourcez: {}\n"
                                                               "          resources:\n")
    f.write_text(typo + "---\n" + DEPLOY)
    assert main(["check", str(f)]) == 1
    assert main(["fix", str(f)]) == 0
    err = capsys.readouterr().err
    assert f.read_text() == typo + "---\n" + FIXED
    assert ("Deployment typo: not changed: `envelope check` refuses it for its fields, as "
            "kubectl apply does (unknown field \"spec.template.spec.containers[0].resourcez\"") in err


def test_a_change_that_cannot_be_written_in_place_is_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deploy.yaml"
    merged = "            limits:\n              <<: {ephemeral-storage: 1Gi}\n"
    text = DEPLOY.replace("            limits:\n", merged)
    f.write_text(text)
    assert main(["fix", str(f)]) == 2
    err = capsys.readouterr().err
    assert "merge key" in err and "nothing written" in err and "Deployment web" in err
    assert f.read_text() == text


def test_multi_document_json_and_list(tmp_path: Path) -> None:
    f = tmp_path / "all.yaml"
    pod = ('{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},\n'
           ' "spec": {"containers": [{"name": "c", "image": "x",\n'
           '   "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}\n')
    lst = ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: q}\n"
           "  spec:\n    containers:\n    - name: c\n      image: x\n      resources:\n"
           "        limits:\n          cpu: 1\n")
    f.write_text(pod + "---\n" + lst)
    assert main(["fix", str(f)]) == 0
    assert f.read_text() == (
        '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},\n'
        ' "spec": {"containers": [{"name": "c", "image": "x",\n'
        '   "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1"}}}]}}\n'
        "---\n" + lst.replace("        limits:\n          cpu: 1\n",
                              "        limits: {}\n        requests:\n          cpu: 1\n"))


def test_files_without_changes_are_left_alone(tmp_path: Path) -> None:
    f = tmp_path / "cm.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: '{{ x }}'}\n")
    before = f.stat().st_mtime_ns
    assert main(["fix", str(tmp_path)]) == 0
    assert f.stat().st_mtime_ns == before


def test_patch_text_names_what_it_cannot_do() -> None:
    with pytest.raises(FixError, match="block scalar"):
        patch_text("a:\n  b: |\n    x\n", [{"op": "replace", "path": "/a/b", "value": "y"}])


def test_as_a_helm_post_renderer(tmp_path: Path) -> None:
    """What the refusal advises works: the real helm renders the chart and pipes the
    output through `envelope fix -` (--post-renderer)."""
    from tests.helpers.chart import helm

    chart = tmp_path / "web"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: web\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("cpu: 500m\n")
    template = DEPLOY.replace("name: web ", "name: {{ .Release.Name }}-web ").replace(
        'cpu:    "2"', "cpu:    {{ .Values.cpu }}")
    (chart / "templates" / "deploy.yaml").write_text(template)
    envelope = Path(sys.executable).parent / "envelope"
    out = helm("template", "rel", str(chart), "--post-renderer", str(envelope),
               "--post-renderer-args", "fix", "--post-renderer-args", "-").stdout
    assert out.startswith("---\n# Source: web/templates/deploy.yaml\n")
    assert out.split("\n", 2)[2] == FIXED.replace("name: web ", "name: rel-web ").replace(
        'cpu: "2"', "cpu: 500m")


def test_as_a_helm_post_renderer_of_a_chart_with_a_chat_template(tmp_path: Path) -> None:
    """Issue 37 class 10, through the real helm: a chart whose rendered ConfigMap holds a
    Jinja chat template ('{{' in a string value, as vLLM's charts ship it) passes
    `envelope fix -` as the post-renderer; the Deployment is fixed, the template kept."""
    from tests.helpers.chart import helm

    chart = tmp_path / "web"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: web\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text(
        "chatTemplate: \"{% for m in messages %}{{ m['content'] }}{% endfor %}\"\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-chat\n"
        "data:\n  template.jinja: {{ .Values.chatTemplate | quote }}\n")
    (chart / "templates" / "deploy.yaml").write_text(DEPLOY)
    envelope = Path(sys.executable).parent / "envelope"
    out = helm("template", "rel", str(chart), "--post-renderer", str(envelope),
               "--post-renderer-args", "fix", "--post-renderer-args", "-").stdout
    assert "template.jinja: \"{% for m in messages %}{{ m['content'] }}{% endfor %}\"" in out, out
    assert out.endswith(FIXED), out


def test_crlf_and_no_final_newline_are_kept(tmp_path: Path) -> None:
    f = tmp_path / "deploy.yaml"
    f.write_bytes(DEPLOY.rstrip("\n").replace("\n", "\r\n").encode())
    assert main(["fix", str(f)]) == 0
    assert f.read_bytes() == FIXED.rstrip("\n").replace("\n", "\r\n").encode()


def test_an_alias_shared_by_two_containers_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Editing an anchored value would change every place that refers to it, which is
    not what the patch does to each: refused, not half-written."""
    f = tmp_path / "deploy.yaml"
    text = DEPLOY.replace("          resources:\n", "          resources: &res\n") + (
        "        - name: second\n          image: nginx\n          resources: *res\n")
    f.write_text(text)
    assert main(["fix", str(f)]) == 2
    err = capsys.readouterr().err
    assert "anchor (&) and alias (*)" in err and "nothing written" in err
    assert f.read_text() == text
