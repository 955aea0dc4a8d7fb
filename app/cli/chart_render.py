"""``envelope check`` on a Helm chart: the chart is rendered with helm and its objects are
judged, each named by the template it came from.

A chart's templates are Go templates, not objects: read as files they were skipped, so a
CI step ``envelope check charts/app`` passed having judged nothing of the chart (issue
35). kube-linter and Polaris render charts themselves; so does this, with ``helm
template`` (``--helm-values``, ``--helm-set``, ``--helm-release``, ``--helm-namespace``
as helm's ``-f``, ``--set``, the release name and ``--namespace``). helm is found as
``$ENVELOPE_HELM``, else ``helm`` on PATH, else the e2e control plane's
(``$ENVELOPE_CONTROLPLANE_BIN``); without one, ``check`` exits 2 saying how to get one or
how to render the chart itself.

Where an object came from: helm writes ``# Source: <chart>/templates/<file>`` above each
rendered document (pkg/action/action.go, ``renderResources``); the object is reported in
that template file, at the line of its ``kind:`` when the template has exactly one such
line, else at the template's first line (a template's lines are not the rendered ones,
so field lines are not given).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.cluster.static import Loaded, LoadError, load_text

__all__ = ["HELM_ENV", "HelmOptions", "find_helm", "no_helm_message", "render_charts"]

HELM_ENV = "ENVELOPE_HELM"
CONTROLPLANE_BIN_ENV = "ENVELOPE_CONTROLPLANE_BIN"
_SOURCE = re.compile(r"^# Source: (\S.*)$", re.MULTILINE)
_TIMEOUT = 120.0


@dataclass(frozen=True)
class HelmOptions:
    values: list[str] = field(default_factory=list)
    set: list[str] = field(default_factory=list)
    release: str = "release-name"
    namespace: str = "default"


def find_helm() -> str | None:
    """``$ENVELOPE_HELM``, else helm on PATH, else ``$ENVELOPE_CONTROLPLANE_BIN/helm``."""
    given = os.environ.get(HELM_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    found = shutil.which("helm")
    if found:
        return found
    bin_dir = os.environ.get(CONTROLPLANE_BIN_ENV)
    if bin_dir and os.access(Path(bin_dir) / "helm", os.X_OK):
        return str(Path(bin_dir) / "helm")
    return None


def no_helm_message(charts: list[str]) -> str:
    given = os.environ.get(HELM_ENV)
    why = (f"${HELM_ENV}={given} is not an executable" if given
           else f"no helm on PATH, ${HELM_ENV} unset")
    first = charts[0]
    return (f"{', '.join(charts)} {'is a Helm chart' if len(charts) == 1 else 'are Helm charts'}"
            f" and rendering needs helm ({why}): install helm 3 (https://helm.sh/docs/intro/install/)"
            f" or set ${HELM_ENV}=/path/to/helm; or render it yourself, `helm template RELEASE "
            f"{first} -f values.yaml | envelope check -f -`; or leave it out with --exclude")


def _template_line(path: Path, kind: object) -> int:
    """The line of ``kind: <kind>`` in the template, when there is exactly one; else 1."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0
    found = [i for i, line in enumerate(text.splitlines(), start=1)
             if re.fullmatch(rf"\s*kind:\s*[\"']?{re.escape(str(kind))}[\"']?\s*", line)]
    return found[0] if len(found) == 1 else 1


def _load_rendered(chart: Path, text: str, out: Loaded) -> None:
    """The objects of ``helm template``'s output, each under its template's path."""
    documents: dict[str, int] = {}
    for chunk in re.split(r"(?m)^---[ \t]*$", text):
        source = _SOURCE.search(chunk)
        if not source:
            if chunk.strip():
                load_text(chunk, f"{chart} (rendered)", out, skip_non_objects=False)
            continue
        inside = source.group(1).split("/", 1)[-1]  # <chart name>/templates/x.yaml
        path = chart / inside
        one = Loaded()
        load_text(chunk, str(path), one, skip_non_objects=False)
        out.errors.extend(one.errors)
        for m in one.manifests:
            documents[str(path)] = documents.get(str(path), 0) + 1
            out.manifests.append(replace(m, document=documents[str(path)],
                                         line=_template_line(path, m.obj.get("kind")), _doc=None))


def render_charts(charts: list[str], helm: str, options: HelmOptions, out: Loaded) -> list[str]:
    """Render each chart into ``out`` (objects, or the helm failure as a load error); the
    charts that rendered."""
    rendered = []
    with tempfile.TemporaryDirectory(prefix="envelope-helm-") as home:
        env = {**os.environ, **{var: str(Path(home) / sub) for var, sub in (
            ("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data"))}}
        for chart in charts:
            args = [helm, "template", options.release, chart, "--namespace", options.namespace]
            for values in options.values:
                args += ["--values", values]
            for assignment in options.set:
                args += ["--set", assignment]
            try:
                proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=_TIMEOUT,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.errors.append(LoadError(chart, f"helm template could not run: {exc}"))
                continue
            if proc.returncode != 0:
                out.errors.append(LoadError(chart, f"helm template failed (exit {proc.returncode}): "
                                                   f"{proc.stderr.strip()[-2000:]}"))
                continue
            _load_rendered(Path(chart), proc.stdout, out)
            rendered.append(chart)
    return rendered
