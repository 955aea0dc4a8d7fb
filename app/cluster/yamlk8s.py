"""YAML scalars and mappings as kubectl reads them (sigs.k8s.io/yaml over go-yaml v2).

kubectl (v1.34: k8s.io/apimachinery v0.34 ``util/yaml``, sigs.k8s.io/yaml v1.6.0,
go.yaml.in/yaml/v2 v2.4.2) turns each YAML document into JSON before anything else
reads it, and the API server only ever sees that JSON. PyYAML's YAML 1.1 resolver
disagrees with go-yaml v2 in places that change a manifest's meaning (``64e3`` is a
number, ``y`` is ``true``, ``1:20`` is a string, merges apply in order...).

This module resolves plain scalars with go-yaml v2's ``resolve()`` (resolve.go) and
builds mappings with its ``decoder.mapping``/``merge`` (decode.go), then applies
sigs.k8s.io/yaml's ``convertToJSONableObject`` to keys and what JSON and
Kubernetes' unstructured decoding do to numbers (integers that fit int64 stay
integers, everything else is a float). ``tests/cluster/test_static.py`` checks it against
the real kubectl over generated scalars. The table of differences: docs/fidelity.md,
"YAML as kubectl reads it".

Why one module of ~400 lines: go-yaml v2's scalar resolution, its mapping builder and
sigs.k8s.io/yaml's key conversion are one decoder behind one entry point (:func:`build`,
all its callers use); the builder is the only caller of the rest.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from typing import Any, cast

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["PLAIN", "YamlValueError", "build"]

#: The tag the loader gives plain scalars without an explicit tag (go-yaml's "implicit").
PLAIN = "!plain"
_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_BINARY = "tag:yaml.org,2002:binary"
_MERGE = "tag:yaml.org,2002:merge"
_UINT = "!uint64"  # go-yaml returns uint64 for unsigned values past int64; JSON keys refuse it
_RESOLVABLE = frozenset({"", PLAIN, _STR, _BOOL, _INT, _FLOAT, _NULL, _TIMESTAMP})

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class YamlValueError(ValueError):
    """A document kubectl would refuse while converting it to JSON."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line
        """0-based line within the text that was parsed."""


# resolve.go: the first character decides what a plain scalar may be.
_HINT: dict[str, str] = {"+": "S", "-": "S", ".": "."}
_HINT.update(dict.fromkeys("0123456789", "D"))
_HINT.update(dict.fromkeys("yYnNtTfFoO~", "M"))
_NAN, _INF = float("nan"), float("inf")
_MAP: dict[str, tuple[str, Any]] = {}
for _tag, _value, _words in (
    (_BOOL, True, "y Y yes Yes YES true True TRUE on On ON"),
    (_BOOL, False, "n N no No NO false False FALSE off Off OFF"),
    (_NULL, None, "~ null Null NULL"),
    (_FLOAT, _NAN, ".nan .NaN .NAN"),
    (_FLOAT, _INF, ".inf .Inf .INF +.inf +.Inf +.INF"),
    (_FLOAT, -_INF, "-.inf -.Inf -.INF"),
):
    for _word in _words.split():
        _MAP[_word] = (_tag, _value)
_MAP[""] = (_NULL, None)

_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
#: strconv.ParseFloat on text starting with ".": digits, Go's underscores between digits.
_DOT_FLOAT = re.compile(r"\.[0-9](_?[0-9])*([eE][-+]?[0-9](_?[0-9])*)?")
_DIGITS = {2: frozenset("01"), 8: frozenset("01234567"), 10: frozenset("0123456789"),
           16: frozenset("0123456789abcdefABCDEF")}
_TIMESTAMPS = (  # go-yaml v2 allowedTimestampFormats, as patterns (explicit !!timestamp only)
    re.compile(r"\d{4}-\d{1,2}-\d{1,2}[Tt]\d{1,2}:\d{1,2}:\d{1,2}(\.\d{1,9})?(Z|[-+]\d{2}:\d{2})"),
    re.compile(r"\d{4}-\d{1,2}-\d{1,2} \d{1,2}:\d{1,2}:\d{1,2}(\.\d{1,9})?"),
    re.compile(r"\d{4}-\d{1,2}-\d{1,2}"),
)


_UINT64_DIGITS = {2: 64, 8: 22, 10: 20, 16: 16}
"""How many digits (leading zeros aside) the largest uint64 has in each base."""


def _go_parse_uint(s: str) -> int | None:
    """strconv.ParseUint(s, 0, 64) without underscores (the caller removed them)."""
    if not s:
        return None
    base = 10
    if s[0] == "0":
        prefix = s[1:2].lower()
        if len(s) >= 3 and prefix in ("b", "o", "x"):
            base, s = {"b": 2, "o": 8, "x": 16}[prefix], s[2:]
        else:
            base, s = 8, s[1:]
    digits = _DIGITS[base]
    if any(c not in digits for c in s):
        return None
    if len(s.lstrip("0")) > _UINT64_DIGITS[base]:
        # More digits than any uint64 has: ParseUint's range error, found without
        # converting (Python's int() refuses more than 4,300 decimal digits).
        return None
    value = int(s, base) if s else 0
    return value if value <= _UINT64_MAX else None


_DECIMAL = re.compile(r"[-+]?[1-9][0-9]{0,17}")  # fits int64 whatever the digits


def _go_parse_int(s: str) -> int | None:
    """strconv.ParseInt(s, 0, 64)."""
    if _DECIMAL.fullmatch(s):
        return int(s)
    negative = s[:1] == "-"
    body = s[1:] if s[:1] in ("+", "-") else s
    value = _go_parse_uint(body)
    if value is None:
        return None
    value = -value if negative else value
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _float(text: str) -> float | None:
    value = float(text)
    return None if math.isinf(value) else value  # Go: out of range is an error


def _resolve(tag: str, value: str) -> tuple[str, Any]:
    """go-yaml v2 ``resolve(tag, in)``: the resolved tag and Go-typed value."""
    if tag not in _RESOLVABLE:
        return tag, value
    hint = _HINT.get(value[0]) if value else "N"
    if hint is not None and tag != _STR:
        known = _MAP.get(value)
        if known is not None:
            return known
        if hint == ".":
            if _DOT_FLOAT.fullmatch(value):
                number = _float(value.replace("_", ""))
                if number is not None:
                    return _FLOAT, number
        elif hint in ("D", "S"):
            if tag == _TIMESTAMP and any(p.fullmatch(value) for p in _TIMESTAMPS):
                return _TIMESTAMP, value
            # An implicit timestamp (YYYY-...) fails every parse below and stays the
            # string it is: go-yaml v2 hands timestamps to interface{} as their text.
            plain = value.replace("_", "")
            integer = _go_parse_int(plain)
            if integer is not None:
                return _INT, integer
            unsigned = _go_parse_uint(plain)
            if unsigned is not None:
                return _UINT, unsigned
            if _YAML_STYLE_FLOAT.fullmatch(plain):
                number = _float(plain)
                if number is not None:
                    return _FLOAT, number
            if plain.startswith("0b") or plain.startswith("-0b"):
                negative = plain[0] == "-"
                digits = plain[3:] if negative else plain[2:]
                if digits and all(c in "01" for c in digits):
                    number = int(digits, 2)
                    number = -number if negative else number
                    if _INT64_MIN <= number <= _INT64_MAX:
                        return _INT, number
                    if not negative and number <= _UINT64_MAX:
                        return _UINT, number
    return _STR, value


def _scalar(node: ScalarNode) -> tuple[str, Any]:
    """go-yaml v2 ``decoder.scalar`` into interface{}: (resolved tag, Go value)."""
    tag = node.tag
    if tag == PLAIN:
        return _resolve("", node.value)
    if tag == _STR:
        return _STR, node.value
    if tag == _BINARY:
        try:
            data = base64.b64decode(node.value.replace("\n", "").replace(" ", ""), validate=True)
        except ValueError:
            raise YamlValueError("!!binary value contains invalid base64 data",
                                 node.start_mark.line) from None
        return _STR, data.decode("utf-8", "replace")
    rtag, value = _resolve(tag, node.value)
    if tag in ("", rtag, _STR) or tag not in _RESOLVABLE:
        return (_STR, node.value) if rtag == _TIMESTAMP else (rtag, value)
    if tag == _FLOAT and rtag == _INT:
        return _FLOAT, float(value)
    raise YamlValueError(f"cannot decode {_short(rtag)} `{node.value}` as a {_short(tag)}",
                         node.start_mark.line)


def _short(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _json_value(rtag: str, value: Any, node: Node) -> Any:
    """What json.Marshal and the unstructured decoder make of a go-yaml scalar."""
    if rtag == _FLOAT:
        if math.isnan(value) or math.isinf(value):
            raise YamlValueError(f"json: unsupported value: {_go_float_name(value)} "
                                 f"(`{node.value}`: JSON has no infinity or NaN; quote it)",
                                 node.start_mark.line)
        if value.is_integer() and _INT64_MIN <= value <= _INT64_MAX:
            return int(value)
        return value
    if rtag == _UINT:
        return float(value)  # past int64: unstructured decodes it as a float64
    return value


def _go_float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _float32_g(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32), as sigs.k8s.io/yaml formats float keys."""
    if math.isnan(value):
        return "NaN"
    try:
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        single = math.copysign(_INF, value)
    if math.isinf(single):
        return "+Inf" if single > 0 else "-Inf"
    if single == 0:
        return "-0" if math.copysign(1, single) < 0 else "0"
    for digits in range(1, 10):  # shortest decimal that reads back as the same float32
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent = text.split("e")
    sign = "-" if mantissa.startswith("-") else ""
    significant = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    exp = int(exponent)
    if exp < -4 or exp >= 6:  # Go's %g with the shortest precision decides at 6
        tail = f".{significant[1:]}" if len(significant) > 1 else ""
        return f"{sign}{significant[0]}{tail}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{significant}"
    whole = significant[:exp + 1].ljust(exp + 1, "0")
    fraction = significant[exp + 1:]
    return f"{sign}{whole}{'.' + fraction if fraction else ''}"


#: Plain scalar text -> its JSON value / key string; manifests repeat the same few
#: hundred values (``"-1"``, ``v1``, ``name``), and resolving one costs microseconds.
_VALUES: dict[str, tuple[Any]] = {}
_KEYS: dict[str, str] = {}
_CACHE_LIMIT = 50_000


def _key(node: Node) -> str:
    """A mapping key as sigs.k8s.io/yaml's convertToJSONableObject turns it into a string."""
    if node.__class__ is ScalarNode and node.tag == PLAIN:
        text = node.value
        hit = _KEYS.get(text)
        if hit is None:
            hit = _key_uncached(node)
            if len(_KEYS) >= _CACHE_LIMIT:
                _KEYS.clear()
            _KEYS[text] = hit
        return hit
    return _key_uncached(node)


def _key_uncached(node: Node) -> str:
    if not isinstance(node, ScalarNode):
        raise YamlValueError("invalid map key: a mapping or sequence cannot be a key",
                             node.start_mark.line)
    rtag, value = _scalar(node)
    if rtag in (_STR, _TIMESTAMP) or isinstance(value, str):
        return value if isinstance(value, str) else node.value
    if rtag == _BOOL:
        return "true" if value else "false"
    if rtag == _INT:
        return str(value)
    if rtag == _FLOAT:
        text = _float32_g(value)
        return {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}.get(text, text)
    kind = "<nil>" if value is None else "uint64"
    raise YamlValueError(f"unsupported map key of type: {kind}, key: `{node.value}`",
                         node.start_mark.line)


class _Builder:
    """One document's nodes to JSON-shaped Python values (go-yaml v2 decode.go)."""

    __slots__ = ("alias_count", "alias_depth", "count", "seen")

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.count = 0
        self.alias_count = 0
        self.alias_depth = 0

    def _visit(self, node: Node) -> bool:
        """decoder.unmarshal's counting and its "billion laughs" guard
        (go.yaml.in/yaml/v2 v2.4.4 decode.go, the version kubectl v1.37.2 reads YAML
        with, through sigs.k8s.io/yaml v1.6.0): every node decoded counts, and counts as
        aliased inside an alias's expansion. PyYAML's composer gives an alias the very
        node it names, so a second visit of a collection is an alias: outside any
        expansion, the alias node and its target are two decodes, as in Go. True when
        ``node`` is entered through an alias (the caller leaves it with ``alias_depth -= 1``)."""
        self.count += 1
        if self.alias_depth:
            self.alias_count += 1
        again = False
        if node.__class__ is not ScalarNode:
            again = id(node) in self.seen
            if again:
                if not self.alias_depth:
                    self.count += 1
                    self.alias_count += 1
                self.alias_depth += 1
            else:
                self.seen.add(id(node))
        if self.alias_count > 100 and self.count > 1000:
            self._check_aliasing(node)
        return again

    def value(self, node: Node) -> Any:
        again = self._visit(node)
        cls = node.__class__
        if cls is ScalarNode:
            if node.tag == PLAIN:
                hit = _VALUES.get(node.value)
                if hit is not None:
                    return hit[0]
            rtag, value = _scalar(cast(ScalarNode, node))  # `cls is ScalarNode` does not narrow
            value = _json_value(rtag, value, node)
            if node.tag == PLAIN:
                if len(_VALUES) >= _CACHE_LIMIT:
                    _VALUES.clear()
                _VALUES[node.value] = (value,)
            return value
        try:
            if cls is MappingNode:
                out: dict[str, Any] = {}
                self.fill(cast(MappingNode, node), out)  # as above, `cls is MappingNode`
                return out
            return [self.value(child) for child in node.value]
        finally:
            if again:
                self.alias_depth -= 1

    def _check_aliasing(self, node: Node) -> None:
        # decode.go allowedAliasRatio, with its message (kubectl: "error converting YAML to
        # JSON: yaml: document contains excessive aliasing").
        count = self.count
        low, high = 400_000, 4_000_000
        ratio = (0.99 if count <= low else 0.10 if count >= high
                 else 0.99 - 0.89 * (count - low) / (high - low))
        if self.alias_count / count > ratio:
            raise YamlValueError("document contains excessive aliasing", node.start_mark.line)

    def fill(self, node: MappingNode, out: dict[str, Any]) -> None:
        """decoder.mapping: keys in order; a merge (``<<``) writes into the same map."""
        for key_node, value_node in node.value:
            if (key_node.__class__ is ScalarNode and key_node.value == "<<"
                    and key_node.tag in (PLAIN, _MERGE)):
                self.merge(value_node, out)
                continue
            out[_key(key_node)] = self.value(value_node)

    def merge(self, node: Node, out: dict[str, Any]) -> None:
        """decoder.merge: a map, or a list of maps where earlier ones take precedence;
        each map merged is decoded (counted, an alias as an alias) like any value, so a
        merge-key bomb is refused as kubectl refuses it, not expanded (issue 38, class 7:
        834 bytes took 11.8 s)."""
        if node.__class__ is MappingNode:
            children: list[Node] = [node]
        elif (node.__class__ is SequenceNode and id(node) not in self.seen  # not an alias
              and all(c.__class__ is MappingNode for c in node.value)):
            children = list(reversed(node.value))
        else:
            raise YamlValueError("map merge requires map or sequence of maps as the value",
                                 node.start_mark.line)
        for child in children:
            again = self._visit(child)
            try:
                self.fill(cast(MappingNode, child), out)
            finally:
                if again:
                    self.alias_depth -= 1


def build(node: Node) -> Any:
    """The JSON value kubectl sends for a composed YAML document."""
    try:
        return _Builder().value(node)
    except RecursionError:
        raise YamlValueError("anchor value contains itself, or nesting is too deep",
                             node.start_mark.line) from None
