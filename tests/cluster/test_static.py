"""Manifests read as kubectl reads them: values, keys, encodings, documents, lines.

The differential tests at the end put the same files through the loader and through
the real kubectl (the e2e control plane's, ``kubectl annotate --local``:
kubectl's own file reading and YAML-to-JSON conversion, no server) and require the
same objects, or both refusing.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.cluster.static import Loaded, load, load_text

THING = "apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: t}\n"


def values(text: str) -> dict[str, Any]:
    out = Loaded()
    load_text(THING + "spec:\n" + text, "t.yaml", out)
    assert not out.errors, out.errors
    return out.manifests[0].obj["spec"]


@pytest.mark.parametrize(
    ("scalar", "expected"),
    [
        ("64e3", 64000), ("1E3", 1000), ("1.5e-3", 0.0015), ("+.5", 0.5), (".5", 0.5),
        ("1.", 1), ("1_000", 1000), (".5_0", 0.5),
        ("y", True), ("Y", True), ("n", False), ("yes", True), ("On", True), ("OFF", False),
        ("TRUE", True), ("tRUE", "tRUE"),
        ("0o17", 15), ("0O17", 15), ("017", 15), ("08", 8), ("09.5", 9.5), ("0x1F", 31),
        ("-0x1F", -31), ("0b101", 5), ("-0b101", -5), ("0b2", "0b2"), ("0x", "0x"),
        ("1:20", "1:20"), ("190:20:30", "190:20:30"),
        ("2001-12-14", "2001-12-14"), ("2001-12-14t21:59:43.10-05:00", "2001-12-14t21:59:43.10-05:00"),
        ("~", None), ("null", None), ("", None), ("NULL", None), ("nULL", "nULL"),
        ("9223372036854775807", 9223372036854775807),
        ("9223372036854775808", 9223372036854775808.0),  # uint64, then float64 in unstructured
        ("99999999999999999999", 1e20), ("1e400", "1e400"), ("1e-400", 0),
        ("0x10000000000000000", "0x10000000000000000"),
        # Past Python's 4,300-digit int() limit: Go's range errors, never a crash.
        ("9" * 5000, "9" * 5000), ("-" + "9" * 5000, "-" + "9" * 5000),
        ("0" + "7" * 5000, "0" + "7" * 5000), ("0x" + "f" * 5000, "0x" + "f" * 5000),
        ("0" * 5000 + "12", 10), ("0x" + "0" * 5000 + "1f", 31),  # a leading 0 is octal
        ("'64e3'", "64e3"), ('"y"', "y"), ("!!str 12", "12"), ("!!float 12", 12),
        ("!custom 12", "12"), ("!!binary aGk=", "hi"),
    ],
)
def test_scalars_resolve_as_go_yaml_v2(scalar: str, expected: Any) -> None:
    got = values(f"  v: {scalar}\n")["v"]
    assert got == expected and type(got) is type(expected), (scalar, got)


def test_keys_become_strings_as_sigs_yaml_makes_them() -> None:
    spec = values("  y: 1\n  1.5: 2\n  64e3: 3\n  0x10: 4\n  1e7: 5\n  0.1: 6\n  no: 7\n")
    assert spec == {"true": 1, "1.5": 2, "64000": 3, "16": 4, "1e+07": 5, "0.1": 6, "false": 7}


def test_merge_keys_apply_in_order_as_go_yaml_does() -> None:
    spec = values("  base: &b {a: 1, b: 1}\n  mx: {a: 2, <<: *b}\n  my: {<<: *b, a: 2}\n"
                  "  mz: {<<: [{a: 3}, {a: 4, c: 4}]}\n")
    assert spec["mx"] == {"a": 1, "b": 1}  # the merge after a comes later and wins
    assert spec["my"] == {"a": 2, "b": 1}
    assert spec["mz"] == {"a": 3, "c": 4}  # earlier maps in a list take precedence


def test_duplicate_keys_keep_the_last() -> None:
    assert values("  a: 1\n  a: 2\n") == {"a": 2}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("  v: .inf\n", "json: unsupported value: +Inf"),
        ("  v: -.Inf\n", "json: unsupported value: -Inf"),
        ("  v: .nan\n", "json: unsupported value: NaN"),
        ("  ~: 1\n", "unsupported map key of type: <nil>"),
        ("  18446744073709551615: 1\n", "unsupported map key of type: uint64"),
        ("  ? [a]\n  : 1\n", "invalid map key"),
        ("  v: !!int abc\n", "cannot decode !!str `abc` as a !!int"),
        ("  v: {<<: 1}\n", "map merge requires map or sequence of maps"),
        ("  a: &a [*a]\n", "anchor"),
        ("  v: [\n", "not valid YAML"),
    ],
)
def test_documents_kubectl_refuses_are_refused_with_file_document_and_line(text: str,
                                                                           problem: str) -> None:
    out = Loaded()
    load_text("apiVersion: v1\nkind: A\n---\n" + THING + "spec:\n" + text, "f.yaml", out)
    assert [m.document for m in out.manifests] == [1]
    [error] = out.errors
    assert error.document == 2 and problem in str(error), str(error)
    assert str(error).startswith("f.yaml:")
    assert 4 <= error.line <= 9


def merge_bomb(levels: int) -> str:
    """Each level merges the one before twice: 2^levels maps merged for ~30 bytes a level
    (issue 38, class 7: 834 bytes took 11.8 s in check and 14.6 s in fix)."""
    lines = ["  l0: &l0 {k: v}"]
    lines += [f"  l{i}: &l{i} {{<<: [*l{i - 1}, *l{i - 1}]}}" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"  top: {{<<: *l{levels}}}", ""])


def list_bomb(levels: int, fan: int = 9) -> str:
    """The "billion laughs": each level a list of ``fan`` aliases of the one before."""
    lines = ["  l0: &l0 [lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [merge_bomb(24), merge_bomb(40), list_bomb(9)])
def test_alias_bombs_are_refused_with_kubectls_message(text: str) -> None:
    out = Loaded()
    load_text(THING + "spec:\n" + text, "bomb.yaml", out)
    [error] = out.errors
    assert "document contains excessive aliasing" in str(error)
    assert out.manifests == []


def test_ordinary_aliases_and_merges_are_read() -> None:
    spec = values("  base: &b {a: 1, b: 1}\n" + "".join(f"  m{i}: {{<<: *b, i: {i}}}\n" for i in range(300)))
    assert spec["m299"] == {"a": 1, "b": 1, "i": 299}
    assert values(merge_bomb(4))["top"] == {"k": "v"}


def test_a_merge_of_an_aliased_sequence_is_refused_as_go_yaml_refuses_it() -> None:
    out = Loaded()
    load_text(THING + "spec:\n  s: &s [{a: 1}]\n  m: {<<: *s}\n", "s.yaml", out)
    [error] = out.errors
    assert "map merge requires map or sequence of maps" in str(error)


def test_many_documents_are_read_without_keeping_their_node_graphs() -> None:
    """Issue 38, class 7: every document's YAML node graph was kept until the whole file
    was read (50,000 documents, 15 MB: 1,076 MiB peak in check). The peak while reading
    now exceeds what is kept (the objects and their text) by one document's graph."""
    import gc
    import tracemalloc

    doc = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: w{i}, namespace: a}}\n"
           "spec:\n  template:\n    spec:\n      containers:\n      - name: c\n        image: x\n"
           "        resources: {{requests: {{cpu: 250m, memory: 256Mi}}, limits: {{memory: 256Mi}}}}\n")
    text = "---\n".join(doc.format(i=i) for i in range(3000))
    out = Loaded()
    gc.collect()
    tracemalloc.start()
    try:
        load_text(text, "many.yaml", out)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out.manifests) == 3000
    assert peak - kept < 2 * 2**20, (kept, peak)  # before: ~40 MB of node graphs at the peak


def test_every_broken_document_is_reported_not_only_the_first() -> None:
    text = ("kind: [\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\n---\n"
            "apiVersion: v1\nkind: ''\n---\napiVersion: v1\nkind: 7\n--- junk\n---\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok2}\n")
    out = Loaded()
    load_text(text, "m.yaml", out)
    assert [m.obj["metadata"]["name"] for m in out.manifests] == ["ok", "ok2"]
    assert sorted((e.document, e.line) for e in out.errors) == [(1, 2), (3, 8), (4, 11), (5, 12)]
    messages = " | ".join(sorted(e.problem for e in out.errors))
    assert "kind is empty" in messages and "kind must be a string, got int 7" in messages
    assert "invalid YAML document separator: junk" in messages


def test_lines_of_objects_list_items_and_fields() -> None:
    text = ("# leading comment\n---\napiVersion: v1\nkind: List\nitems:\n"
            "- apiVersion: v1\n  kind: Pod\n  metadata: {name: a}\n"
            "- apiVersion: v1\n  kind: Pod\n  metadata: {name: b}\n  spec:\n    containers:\n"
            "    - name: c\n      resources:\n        limits:\n          nvidia.com/gpu: 1\n"
            "---\n\n\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n")
    out = Loaded()
    load_text(text, "l.yaml", out)
    a, b, c = out.manifests
    assert (a.line, b.line, c.line) == (6, 9, 21)
    assert (a.document, b.document, c.document) == (2, 2, 3)
    assert b.line_of("spec.containers[0].resources.limits.nvidia.com/gpu") == 17
    assert b.line_of("/spec/containers/0/resources/limits/nvidia.com~1gpu") == 17
    assert b.line_of("spec.containers[0].resources.requests.cpu") == 15  # nearest: resources
    assert c.line_of("metadata.name") == 24
    assert c.line_of("") == 21


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16-le", "utf-16-be", "utf-8"])
def test_encodings_kubectl_reads(tmp_path: Path, encoding: str) -> None:
    bom = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}.get(encoding, b"")
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: café}\n"
    (tmp_path / "m.yaml").write_bytes(bom + text.encode(encoding))
    loaded = load([str(tmp_path / "m.yaml")])
    assert not loaded.errors
    assert loaded.manifests[0].obj["metadata"]["name"] == "café"


def test_utf16_without_bom_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_bytes("apiVersion: v1\nkind: Pod\n".encode("utf-16-le"))
    loaded = load([str(tmp_path)])
    assert loaded.errors and str(loaded.errors[0]).startswith(str(tmp_path / "m.yaml"))


def test_directory_walk_skips_what_is_not_kubernetes(tmp_path: Path) -> None:
    obj = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\n"
    files = {
        "app/cm.yaml": obj % "a",
        "app/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\n"
                                  "kind: Kustomization\nresources: [cm.yaml]\n",
        "chart/Chart.yaml": "apiVersion: v2\nname: c\nversion: 1.0.0\n",
        "chart/values.yaml": "replicas: 2\n",
        "chart/templates/d.yaml": "apiVersion: v1\nkind: {{ .Values.kind }}\n",
        ".venv/lib/x.yaml": obj % "venv",
        ".git/x.yaml": obj % "git",
        "node_modules/p/x.yaml": obj % "npm",
        "ci/workflow.yml": "on: push\njobs: {}\n",
        "legacy/old.yaml": obj % "old",
        "notes.txt": "text",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    loaded = load([str(tmp_path)], exclude=["legacy"])
    assert not loaded.errors
    assert [m.obj["metadata"]["name"] for m in loaded.manifests] == ["a"]
    reasons = {str(Path(p).relative_to(tmp_path)): r for p, r in
               ((s.path, s.reason) for s in loaded.skipped)}
    assert reasons == {
        ".git": "directory not walked", ".venv": "directory not walked",
        "node_modules": "directory not walked", "legacy": "excluded",
        "app/kustomization.yaml": "a kustomization, not an API object",
        "chart/templates": "Helm chart templates (render them first)",
        "chart/Chart.yaml": "no document has apiVersion and kind",
        "chart/values.yaml": "no document has apiVersion and kind",
        "ci/workflow.yml": "no document has apiVersion and kind",
    }
    assert [m.obj["metadata"]["name"] for m in
            load([str(tmp_path / "app")], exclude=["*.yaml"]).manifests] == []


# ------------------------------------------------------------- differential: kubectl

_PIECES = ["0", "1", "7", "8", "9", "12", "64", "017", "0x1F", "0o17", "0b101", "0b2", "1_0",
           "_", ".", "e3", "E-2", "e+400", "e-400", "inf", "Inf", "nan", ":", ":20", "-", "+",
           "y", "Y", "n", "N", "yes", "No", "on", "OFF", "true", "False", "null", "~", "x", "T",
           "2001-12-14", "t21:59:43.10", "Z", "-05:00", "99999999999999999999", "9223372036854775808",
           "18446744073709551615", "18446744073709551616", "0.1", "1.5", "3.4028235e38"]


def generated_scalars(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = set(_PIECES)
    while len(out) < n:
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 3)))
        if text[0] not in "-:?" and not text.endswith(":"):
            out.add(text)
    return sorted(out)


def _same(ours: Any, theirs: Any) -> bool:
    """Equal as JSON values. kubectl prints a float64 in Go's shortest form
    (1.8446744073709552e19 as 18446744073709552000), so a float of ours is compared
    with their number read as a float; integers must be equal exactly."""
    if isinstance(ours, bool) or isinstance(theirs, bool) or ours is None or theirs is None:
        return ours is theirs
    if isinstance(ours, float) and isinstance(theirs, int | float):
        return ours == float(theirs)
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(_same(v, theirs[k]) for k, v in ours.items())
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    return type(ours) is type(theirs) and ours == theirs


def _kubectl(kubectl: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kubectl), "annotate", "--local", "-f", str(path), "-o", "json",
                           "checked=yes"], capture_output=True, text=True, timeout=120,
                          env={"KUBECONFIG": "/nonexistent", "PATH": "/usr/bin:/bin"})


def _differential(tmp_path: Path, kubectl: Path, documents: list[str]) -> None:
    ours = Loaded()
    refused: dict[int, str] = {}
    accepted: list[tuple[int, dict[str, Any]]] = []
    for i, doc in enumerate(documents):
        one = Loaded()
        load_text(doc, f"doc{i}", one)
        if one.errors:
            refused[i] = str(one.errors[0])
        else:
            accepted.append((i, one.manifests[0].obj))
        ours.errors.extend(one.errors)
    batch = tmp_path / "batch.yaml"
    batch.write_text("\n---\n".join(documents[i] for i, _ in accepted))
    done = _kubectl(kubectl, batch)
    assert done.returncode == 0, done.stderr[-2000:]
    items, decoder, at = [], json.JSONDecoder(), 0
    text = done.stdout
    while text[at:].strip():  # one JSON object per document, one after another
        at += len(text[at:]) - len(text[at:].lstrip())
        item, at = decoder.raw_decode(text, at)
        items.append(item)
    assert len(items) == len(accepted)
    disagreements = []
    for (i, obj), theirs in zip(accepted, items, strict=True):
        if not _same(obj["spec"], theirs["spec"]):
            disagreements.append((documents[i], obj["spec"], theirs["spec"]))
    for i, why in refused.items():
        single = tmp_path / f"refused{i}.yaml"
        single.write_text(documents[i])
        if _kubectl(kubectl, single).returncode == 0:
            disagreements.append((documents[i], why, "kubectl accepted it"))
    assert not disagreements, disagreements[:10]
    assert len(accepted) > 50 and len(refused) > 5  # the generator reaches both sides


@pytest.mark.e2e
def test_scalars_and_keys_agree_with_kubectl(tmp_path: Path) -> None:
    from tests.helpers.chart import bin_dir

    kubectl = bin_dir() / "kubectl"
    scalars = generated_scalars(seed=12, n=400)
    documents = []
    for s in scalars:
        documents.append(f"{THING}spec:\n  v: {s}\n  q: '{s}'\n  k:\n    {s}: 1\n")
    documents += [f"{THING}spec:\n  m: {{a: 1, <<: {{a: 2, b: 3}}}}\n  n: {{<<: [{{a: 1}}, {{a: 2}}]}}\n",
                  f"{THING}spec:\n  d: 1\n  d: 2\n"]
    _differential(tmp_path, kubectl, documents)


@pytest.mark.e2e
def test_aliasing_is_refused_where_kubectl_refuses_it(tmp_path: Path) -> None:
    """Alias-heavy documents on both sides of go-yaml's allowedAliasRatio: the same
    verdict as kubectl v1.37.2 on each (refused with the same message, or read the same)."""
    from tests.helpers.chart import bin_dir

    kubectl = bin_dir() / "kubectl"
    documents = [THING + "spec:\n" + t for t in (
        merge_bomb(3), merge_bomb(6), merge_bomb(8), merge_bomb(10), merge_bomb(14), merge_bomb(24),
        list_bomb(2), list_bomb(3), list_bomb(4), list_bomb(5), list_bomb(9),
        list_bomb(3, fan=40), list_bomb(2, fan=120))]
    for i, doc in enumerate(documents):
        path = tmp_path / f"alias{i}.yaml"
        path.write_text(doc)
        done = _kubectl(kubectl, path)
        out = Loaded()
        load_text(doc, str(path), out)
        if done.returncode != 0:
            assert "document contains excessive aliasing" in done.stderr, done.stderr[-500:]
            assert [e.problem for e in out.errors] == ["cannot convert to JSON as kubectl does: "
                                                      "document contains excessive aliasing"], (i, out.errors)
        else:
            assert out.errors == [], (i, out.errors)
            assert _same(out.manifests[0].obj["spec"], json.loads(done.stdout)["spec"]), i


@pytest.mark.e2e
def test_encodings_agree_with_kubectl(tmp_path: Path) -> None:
    from tests.helpers.chart import bin_dir

    kubectl = bin_dir() / "kubectl"
    text = THING + "spec: {v: café, n: 64e3}\n"
    for name, data in {"utf8bom": b"\xef\xbb\xbf" + text.encode(),
                       "utf16le": b"\xff\xfe" + text.encode("utf-16-le"),
                       "utf16be": b"\xfe\xff" + text.encode("utf-16-be"),
                       "latin1": text.encode("latin-1")}.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(data)
        done = _kubectl(kubectl, path)
        assert done.returncode == 0, (name, done.stderr)
        loaded = load([str(path)])
        assert not loaded.errors
        assert loaded.manifests[0].obj["spec"] == json.loads(done.stdout)["spec"], name
