"""Strict field validation offline: what ``kubectl apply --validate=strict`` refuses.

kubectl asks the API server to decode with ``fieldValidation=Strict``: an unknown or
mistyped field name anywhere in a built-in object (``resource:`` for ``resources:``)
refuses the whole object (``strict decoding error: unknown field ...``), and an unknown
kind or version fails kubectl's REST mapping (``no matches for kind "Deploymnet" ...``).
``envelope check`` reads raw files, so without this a typo passes offline and fails at
apply time. The schema is the API server's own: ``python -m app.cluster.fieldschema
--kubeconfig K`` writes the field structure of every built-in group it serves (from
``/openapi/v3`` and discovery) to ``app/cluster/data/fieldschema.json.gz``; the custom
resources Envelope judges are checked against their published CRD schemas, vendored by
``--crds`` from ``CRD_SOURCES`` into ``app/cluster/data/crdschema.json.gz``. Other custom
resources are never refused here (only their metadata's types).

Proof against kubectl, and the vendored CRDs: docs/fidelity.md, "Field validation oracle".

Why one module of ~520 lines: building the field structure (from OpenAPI v3 and from CRD
schemas, one format for both) and walking an object against it are one schema's two
ends; a reader changes both together when the format changes.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from app.core.config import did_you_mean

__all__ = ["FIELDS_RULE", "FieldProblem", "FieldSchema", "compact", "default_schema", "metadata_problems",
           "prune"]

FIELDS_RULE = "fields"
"""The rule id of strict field validation's findings in ``envelope check`` (not a rule of
the rule set: the API server decides it before admission; ``envelope explain fields``)."""
DATA = Path(__file__).resolve().parent / "data" / "fieldschema.json.gz"
CRD_DATA = DATA.with_name("crdschema.json.gz")
CRD_SOURCES = {
    "e2e/crds/kai-resources.yaml":
        "kai-scheduler/kai-resource-management-api 732bf842 config/crd/kai.resources_{nodepools,"
        "departments,projects}.yaml: the same fields, written from them (tests/cluster/test_fieldschema.py "
        "holds the spec fields to upstream's)",
    "e2e/crds/sources/kai-scheduler-d5bc503a/scheduling.run.ai_queues.yaml":
        "kai-scheduler/KAI-Scheduler d5bc503a deployments/kai-scheduler/crds/"
        "scheduling.run.ai_queues.yaml, verbatim",
    "e2e/crds/sources/agent-substrate-86e138f6/ate.dev_actortemplates.yaml":
        "agent-substrate/substrate 86e138f6 manifests/ate-install/generated/"
        "ate.dev_actortemplates.yaml, verbatim",
    "e2e/crds/ate-dev.yaml":
        "hand-written from agent-substrate's types (its header); only its ActorTemplate, for "
        "spec.resources and spec.imagePullSecrets, which Envelope's actor rules judge and "
        "86e138f6's generated CRD does not name",
    "e2e/crds/substrate/crd-era-86e138f6/ate.dev_workerpools.yaml":
        "agent-substrate/substrate 86e138f6 manifests/ate-install/generated/"
        "ate.dev_workerpools.yaml, verbatim",
    "e2e/crds/substrate/current/ate.dev_workerpools.yaml":
        "controller-gen v0.20.1 on agent-substrate's WorkerPool types after #1298 "
        "(docs/upstream.md, How the current WorkerPool CRD was made)",
}
"""The CRD files ``crdschema.json.gz`` is made from (repository paths) and where each comes
from; the file records this too (``sources``)."""
CRD_ONLY = {"e2e/crds/ate-dev.yaml": ("ActorTemplate",)}
"""The kinds taken from a source that has others (by default: every CRD in the file)."""

Node = str | dict[str, Any]
"""A compact schema node: a type name, or ``{"p": {field: node}}`` (an object with these
fields and no others), ``{"a": node}`` (a map of values of that node), ``{"i": node}`` (a
list of them), ``{"u": 1}`` (anything is kept: preserve-unknown-fields, RawExtension), or
``{}`` (a scalar)."""


@dataclass(frozen=True, slots=True)
class FieldProblem:
    path: str
    """Where, as the API server names it (``spec.template.spec.containers[0].resource``);
    ``kind`` or ``apiVersion`` for a type it does not serve."""
    message: str
    unknown_field: bool = True
    """False for an unknown kind or version (the object cannot be judged at all)."""


OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

_STRING, _INT64, _BOOL, _TIME = "string", "int64", "bool", "time"
_META_FIELDS: dict[str, str | tuple[str, str]] = {
    "name": _STRING, "generateName": _STRING, "namespace": _STRING, "selfLink": _STRING,
    "uid": _STRING, "resourceVersion": _STRING, "generation": _INT64,
    "creationTimestamp": _TIME, "deletionTimestamp": _TIME,
    "deletionGracePeriodSeconds": _INT64,
    "labels": ("map", _STRING), "annotations": ("map", _STRING),
    "finalizers": ("list", _STRING), "ownerReferences": ("list", "ownerReference"),
    "managedFields": ("list", "managedFields"),
}
"""ObjectMeta's Go field types (``k8s.io/apimachinery/pkg/apis/meta/v1/types.go``): what
the API server's JSON decoding refuses with ``cannot unmarshal bool into Go struct field
ObjectMeta.metadata.labels of type string``, in every ``--validate`` mode, for built-in
kinds and custom resources alike (a CR's metadata is decoded into ObjectMeta too)."""
_OWNER_FIELDS = {"apiVersion": _STRING, "kind": _STRING, "name": _STRING, "uid": _STRING,
                 "controller": _BOOL, "blockOwnerDeletion": _BOOL}
_MANAGED_FIELDS = {"manager": _STRING, "operation": _STRING, "apiVersion": _STRING,
                   "time": _TIME, "fieldsType": _STRING, "subresource": _STRING}
_INT64_RANGE = (-(2**63), 2**63 - 1)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value if abs(value) < 1e15 else format(value, '.3g')})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _scalar_problem(value: object, want: str) -> str | None:
    """Why Go's JSON decoder refuses ``value`` for a field of type ``want`` (None: it
    takes it; null always decodes, to the zero value)."""
    if value is None:
        return None
    if want in (_STRING, _TIME):
        if isinstance(value, str):
            return None
        hint = ("; in YAML an unquoted y, yes, on, true, n, no, off or false is a boolean: "
                "quote it" if isinstance(value, bool) else
                "; quote it" if isinstance(value, (int, float)) else "")
        return f"expected a string, got {_json_type(value)}{hint}"
    if want == _INT64:
        if isinstance(value, int) and not isinstance(value, bool) and \
                _INT64_RANGE[0] <= value <= _INT64_RANGE[1]:
            return None
        if isinstance(value, float) and value.is_integer() and \
                _INT64_RANGE[0] <= value <= _INT64_RANGE[1]:
            return None
        return f"expected an integer (int64), got {_json_type(value)}"
    if want == _BOOL:
        return None if isinstance(value, bool) else f"expected true or false, got {_json_type(value)}"
    return None


def _fields_problems(value: object, fields: Mapping[str, str | tuple[str, str]], path: str,
                     out: list[FieldProblem]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        out.append(FieldProblem(path, f"{path}: expected an object, got {_json_type(value)}", False))
        return
    for key, want in fields.items():
        if key not in value:
            continue
        where = f"{path}.{key}"
        item = value[key]
        if isinstance(want, str):
            why = _scalar_problem(item, want)
            if why:
                out.append(FieldProblem(where, f"{where}: {why}", False))
            continue
        shape, of = want
        if item is None:
            continue
        if shape == "map":
            if not isinstance(item, dict):
                out.append(FieldProblem(where, f"{where}: expected a map of strings, got "
                                               f"{_json_type(item)}", False))
                continue
            for k, v in item.items():
                why = _scalar_problem(v, of)
                if why:
                    out.append(FieldProblem(f"{where}.{k}", f"{where}.{k}: {why}", False))
            continue
        if not isinstance(item, list):
            out.append(FieldProblem(where, f"{where}: expected a list, got {_json_type(item)}", False))
            continue
        for i, element in enumerate(item):
            at = f"{where}[{i}]"
            if of == "ownerReference":
                _fields_problems(element, _OWNER_FIELDS, at, out)
            elif of == "managedFields":
                _fields_problems(element, _MANAGED_FIELDS, at, out)
            else:
                why = _scalar_problem(element, of)
                if why:
                    out.append(FieldProblem(at, f"{at}: {why}", False))


def metadata_problems(meta: object, path: str = "metadata") -> list[FieldProblem]:
    """What the API server's decoding refuses in an ObjectMeta at ``path``: a field of the
    wrong JSON type (a label value ``true``, annotations a list, a name that is a number).
    ``unknown_field`` is False: no ``--validate`` mode lets it through."""
    out: list[FieldProblem] = []
    _fields_problems(meta, _META_FIELDS, path, out)
    return out


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _convert(node: Mapping[str, Any], names: bool = False) -> Node:
    """``names``: a node that keeps unknown fields keeps its named ones too (``{"u": 1,
    "p": ...}``), for :func:`_merge`; checking treats it as keeping anything."""
    if "$ref" in node:
        return _ref_name(node["$ref"])
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return _ref_name(all_of[0]["$ref"])
    if node.get("x-kubernetes-preserve-unknown-fields"):
        if names and isinstance(node.get("properties"), dict):
            return {"u": 1, "p": {k: _convert(v, names) for k, v in sorted(node["properties"].items())}}
        return {"u": 1}
    out: dict[str, Any] = {}
    if isinstance(node.get("properties"), dict):
        out["p"] = {k: _convert(v, names) for k, v in sorted(node["properties"].items())}
    if isinstance(node.get("items"), dict):
        out["i"] = _convert(node["items"], names)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["a"] = _convert(extra, names) if extra else {"u": 1}
    elif extra is True:
        out["a"] = {"u": 1}
    if node.get("type") == "object" and not out:
        return {"u": 1}  # RawExtension, JSON, FieldsV1: Go decodes anything into them
    return out


LEGACY_GROUPS = frozenset({"", "apps", "autoscaling", "batch", "policy"})


def built_in(group: str) -> bool:
    """Kubernetes' own API groups: the legacy ones and ``*.k8s.io`` (which a CRD may take
    only with an API-review approval); everything else is a custom resource."""
    return group in LEGACY_GROUPS or group.endswith(".k8s.io")


def compact(openapi: Mapping[str, Mapping[str, Any]], discovery: Mapping[str, Any],
            version: str) -> dict[str, Any]:
    """The field structure of every kind the API server serves.

    ``openapi``: ``/openapi/v3`` documents by path (``apis/apps/v1``); ``discovery``:
    group-version (``apps/v1``, ``v1``) -> its APIResourceList."""
    types: dict[str, Node] = {}
    for doc in openapi.values():
        for name, schema in ((doc.get("components") or {}).get("schemas") or {}).items():
            types.setdefault(name, _convert(schema))
    gvk_type: dict[tuple[str, str, str], str] = {}
    for doc in openapi.values():
        for name, schema in ((doc.get("components") or {}).get("schemas") or {}).items():
            for gvk in schema.get("x-kubernetes-group-version-kind") or ():
                gvk_type.setdefault((gvk.get("group", ""), gvk["version"], gvk["kind"]), name)
    kinds: dict[str, dict[str, str]] = {}
    for group_version, resources in sorted(discovery.items()):
        group, _, ver = group_version.rpartition("/")
        if not built_in(group):
            continue
        for resource in resources.get("resources") or ():
            if "/" in resource["name"]:
                continue  # subresources (status, scale, eviction) are not written by files
            name = gvk_type.get((group, ver, resource["kind"]))
            if name:
                kinds.setdefault(group_version, {})[resource["kind"]] = name
    used: dict[str, Node] = {}
    pending = [n for by_kind in kinds.values() for n in by_kind.values()]
    while pending:
        name = pending.pop()
        if name in used or name not in types:
            continue
        used[name] = types[name]
        pending.extend(_refs(types[name]))
    return {"kubernetesVersion": version, "kinds": kinds, "types": dict(sorted(used.items()))}


def _merge(a: Node, b: Node) -> Node:
    """A node that knows every field ``a`` or ``b`` names (two schemas of one kind). Where
    one keeps unknown fields and the other names its fields, the names decide: a schema
    written to stay open (e2e/crds/ate-dev.yaml) does not undo the published one."""
    if a == b:
        return a
    if isinstance(a, str) or isinstance(b, str):
        return {"u": 1}
    if ("u" in a and not b) or ("u" in b and not a):
        return {"u": 1}  # a scalar or free node beside a free one
    out: dict[str, Any] = {"u": 1} if "u" in a and "u" in b else {}
    if "p" in a or "p" in b:
        pa, pb = a.get("p") or {}, b.get("p") or {}
        out["p"] = {k: _merge(pa[k], pb[k]) if k in pa and k in pb else pa[k] if k in pa else pb[k]
                    for k in sorted({*pa, *pb})}
    for key in ("i", "a"):
        if key in a and key in b:
            out[key] = _merge(a[key], b[key])
        elif key in a or key in b:
            out[key] = a[key] if key in a else b[key]
    return out


def crd_compact(crds: Iterable[Mapping[str, Any]], sources: Mapping[str, str]) -> dict[str, Any]:
    """The field structure of every served version of these CustomResourceDefinitions, in
    :func:`compact`'s form (types named ``<group>/<version>.<Kind>``); the root's
    ``metadata`` is ObjectMeta, as the API server decodes it for every custom resource."""
    kinds: dict[str, dict[str, str]] = {}
    types: dict[str, Node] = {}
    for crd in crds:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if not version.get("served", True) or not isinstance(schema, dict):
                continue
            node = _convert(schema, names=True)
            if isinstance(node, dict) and "metadata" in (node.get("p") or {}):
                node["p"]["metadata"] = OBJECT_META
            group_version, kind = f"{spec['group']}/{version['name']}", spec["names"]["kind"]
            name = f"{group_version}.{kind}"
            types[name] = _merge(types[name], node) if name in types else node
            kinds.setdefault(group_version, {})[kind] = name
    return {"kinds": kinds, "types": dict(sorted(types.items())), "sources": dict(sources)}


def _refs(node: Node) -> Iterator[str]:
    if isinstance(node, str):
        yield node
        return
    for key in ("i", "a"):
        if key in node:
            yield from _refs(node[key])
    for child in (node.get("p") or {}).values():
        yield from _refs(child)


class FieldSchema:
    """The vendored structure; :meth:`check` finds what strict decoding refuses."""

    def __init__(self, data: Mapping[str, Any], crds: Mapping[str, Any] | None = None) -> None:
        self.version: str = data["kubernetesVersion"]
        self.kinds: dict[str, dict[str, str]] = data["kinds"]
        self.types: dict[str, Node] = dict(data["types"])
        self.custom: dict[str, dict[str, str]] = dict(crds["kinds"]) if crds else {}
        """Custom resource kinds with a vendored CRD schema (:func:`crd_compact`)."""
        if crds:
            self.types.update(crds["types"])
        self.groups: dict[str, list[str]] = {}
        for group_version in self.kinds:
            group, _, ver = group_version.rpartition("/")
            self.groups.setdefault(group, []).append(ver)

    def covers(self, api_version: str) -> bool:
        """Whether objects of this apiVersion's group are built into Kubernetes."""
        return api_version.rpartition("/")[0] in self.groups

    def check(self, obj: Mapping[str, Any]) -> list[FieldProblem]:
        """Unknown kind/version of a built-in group, else every unknown field (the API
        server lists them all). A custom resource is checked against its vendored CRD
        schema, if any (else only its metadata's types)."""
        api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
        group = api_version.rpartition("/")[0]
        if group not in self.groups:
            crd = self.custom.get(api_version, {}).get(kind)
            if crd is None:
                return metadata_problems(obj.get("metadata")) if "metadata" in obj else []
            found: list[FieldProblem] = []
            self._walk(obj, crd, "", found)
            return found
        by_kind = self.kinds.get(api_version)
        if by_kind is None:
            served = ", ".join(sorted(f"{group}/{v}" if group else v for v in self.groups[group]))
            return [FieldProblem("apiVersion", f"no matches for kind {kind!r} in version "
                                               f"{api_version!r}: Kubernetes {self.version} "
                                               f"serves {served}", False)]
        if kind not in by_kind:
            elsewhere = sorted(gv for gv, ks in self.kinds.items() if kind in ks)
            hint = (f"; {kind} is served by {', '.join(elsewhere)}" if elsewhere
                    else did_you_mean(kind, by_kind))
            return [FieldProblem("kind", f"no matches for kind {kind!r} in version "
                                         f"{api_version!r}{hint}", False)]
        problems: list[FieldProblem] = []
        self._walk(obj, by_kind[kind], "", problems)
        return problems

    def _resolve(self, node: Node) -> dict[str, Any]:
        while isinstance(node, str):
            node = self.types.get(node, {"u": 1})
        return node

    def _walk(self, value: Any, node: Node, path: str, out: list[FieldProblem]) -> None:
        # An explicit stack: a 1,000-level document must not exhaust Python's recursion.
        stack: list[tuple[Any, Node, str]] = [(value, node, path)]
        while stack:
            value, node, path = stack.pop()
            if node == OBJECT_META:
                out.extend(metadata_problems(value, path))
            shape = self._resolve(node)
            if "u" in shape:
                continue
            if isinstance(value, dict):
                fields = shape.get("p")
                if fields is not None:
                    for key in value:
                        where = f"{path}.{key}" if path else str(key)
                        if key not in fields:
                            out.append(FieldProblem(where, f'unknown field "{where}"'
                                                           f"{did_you_mean(str(key), fields)}"))
                    stack.extend((value[k], fields[k], f"{path}.{k}" if path else str(k))
                                 for k in reversed(list(value)) if k in fields)
                elif "a" in shape:
                    stack.extend((v, shape["a"], f"{path}[{k}]") for k, v in value.items())
            elif isinstance(value, list) and "i" in shape:
                stack.extend((v, shape["i"], f"{path}[{i}]")
                             for i, v in reversed(list(enumerate(value))))
        out.sort(key=lambda p: p.path)


def prune(obj: dict[str, Any], problems: list[FieldProblem]) -> dict[str, Any]:
    """``obj`` without its unknown fields: what the API server stores when asked to warn
    or ignore (``--validate=warn|false``)."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(obj))
    for problem in problems:
        if not problem.unknown_field:
            continue
        parent: Any = out
        steps = _steps(problem.path)
        for step in steps[:-1]:
            parent = parent[step]
        parent.pop(steps[-1], None)
    return out


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.split("[")
        if name:
            steps.append(name)
        steps.extend(int(i.rstrip("]")) if i.rstrip("]").isdigit() else i.rstrip("]")
                     for i in indexes)
    return steps


@cache
def default_schema() -> FieldSchema:
    """The vendored schemas, built-in and custom resources (read once)."""
    return FieldSchema(orjson.loads(gzip.decompress(DATA.read_bytes())),
                       orjson.loads(gzip.decompress(CRD_DATA.read_bytes())))


def crd_data(root: Path) -> dict[str, Any]:
    """``crdschema.json.gz``'s content, made from the files of :data:`CRD_SOURCES` under
    ``root`` (the repository)."""
    import yaml

    documents: list[Mapping[str, Any]] = []
    for path in CRD_SOURCES:
        only = CRD_ONLY.get(path)
        documents.extend(d for d in yaml.safe_load_all((root / path).read_text()) if isinstance(d, dict)
                         and (only is None or (d.get("spec") or {}).get("names", {}).get("kind") in only))
    return crd_compact(documents, CRD_SOURCES)


def read_from_cluster(kubeconfig: str | None) -> dict[str, Any]:
    """``/openapi/v3`` and discovery of every group-version the API server serves."""
    from app.cluster.kube import KubeClient, kube_configuration

    client = KubeClient(kube_configuration(kubeconfig))
    index = client.request("GET", "/openapi/v3")
    openapi = {path: client.request("GET", entry["serverRelativeURL"])
               for path, entry in index["paths"].items()
               if path == "api/v1" or (path.startswith("apis/") and path.count("/") == 2)}
    discovery: dict[str, Any] = {"v1": client.request("GET", "/api/v1")}
    for group in client.request("GET", "/apis")["groups"]:
        for ver in group["versions"]:
            discovery[ver["groupVersion"]] = client.request("GET", f"/apis/{ver['groupVersion']}")
    version = client.request("GET", "/version")["gitVersion"]
    return compact(openapi, discovery, version)


def encode(data: Mapping[str, Any]) -> bytes:
    """The vendored file's bytes: sorted JSON, gzip without a timestamp (reproducible)."""
    return gzip.compress(orjson.dumps(data, option=orjson.OPT_SORT_KEYS), mtime=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.cluster.fieldschema", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", help="the API server to read (default: $KUBECONFIG)")
    parser.add_argument("--out", default=None, help=f"where to write (default: {DATA}, or "
                                                    f"{CRD_DATA} with --crds)")
    parser.add_argument("--crds", action="store_true",
                        help="write the custom resources' schemas from the CRD files CRD_SOURCES "
                             "names (under the repository) instead of reading an API server")
    args = parser.parse_args(argv)
    if args.crds:
        crds = crd_data(Path(__file__).resolve().parents[2])
        out = Path(args.out or CRD_DATA)
        out.write_bytes(encode(crds))
        print(f"wrote {out}: {sum(map(len, crds['kinds'].values()))} kinds from "
              f"{len(CRD_SOURCES)} CRD files", file=sys.stderr)
        return 0
    args.out = args.out or str(DATA)
    data = read_from_cluster(args.kubeconfig)
    Path(args.out).write_bytes(encode(data))
    print(f"wrote {args.out}: {len(data['types'])} types, "
          f"{sum(map(len, data['kinds'].values()))} kinds, Kubernetes {data['kubernetesVersion']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
