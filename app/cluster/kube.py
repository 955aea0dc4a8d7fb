"""A small API-server client: the official client's configuration (in-cluster
service account or kubeconfig: auth, TLS) and its urllib3 pool, with plain dicts in
and out — no generated models on any path we own."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson
import urllib3
from kubernetes import config as kube_config
from kubernetes.client import Configuration
from kubernetes.client.rest import RESTClientObject

__all__ = ["ApiError", "ClusterConfigError", "KubeClient", "kube_configuration", "loads", "pages",
           "serve_configuration"]


def kube_configuration(kubeconfig: str | None = None) -> Configuration:
    """In-cluster service account when running in a pod, else the kubeconfig."""
    configuration = Configuration()
    if kubeconfig is None:
        try:
            # kubernetes.config's loaders have no annotations (the package ships py.typed)
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
            return configuration
        except kube_config.ConfigException:
            pass
    kube_config.load_kube_config(  # type: ignore[no-untyped-call]  # unannotated, as above
        config_file=kubeconfig, client_configuration=configuration)
    return configuration


class ClusterConfigError(Exception):
    """A cluster configuration was asked for (or found) and cannot be loaded."""


DEFAULT_KUBECONFIG = "~/.kube/config"


def serve_configuration(kubeconfig: str | None) -> tuple[Configuration | None, str]:
    """The cluster ``envelope serve`` reads, decided once at start: (configuration,
    where it came from), or (None, why there is none).

    - A kubeconfig asked for (``--kubeconfig`` or ``KUBECONFIG``; a list separated by
      ``:`` as kubectl reads it) must load: a missing, empty or unparsable file raises
      :class:`ClusterConfigError` naming it — never an empty cluster in its place.
    - Else, in a pod (``KUBERNETES_SERVICE_HOST`` set) the service account must load.
    - Else ``~/.kube/config`` if it exists (and then it must load).
    - Else there is no cluster: (None, the reason), for ``--cluster-view auto`` to say
      loudly that rules see an empty cluster.
    """
    def load(path: str, what: str) -> Configuration:
        paths = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
        if not any(os.path.isfile(p) for p in paths):
            raise ClusterConfigError(f"cannot load {what} {path}: no such file")
        configuration = Configuration()
        try:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]  # unannotated library
                config_file=path, client_configuration=configuration)
        except Exception as exc:  # yaml, ConfigException, a missing cert file: all mean unusable
            text = " ".join(str(exc).split())[:300]
            raise ClusterConfigError(f"cannot load {what} {path}: {text}") from exc
        return configuration

    if kubeconfig:
        return load(kubeconfig, "kubeconfig (--kubeconfig / KUBECONFIG)"), f"kubeconfig {kubeconfig}"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = Configuration()
        try:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]  # unannotated library
                client_configuration=configuration)
        except Exception as exc:
            raise ClusterConfigError(
                f"in a pod (KUBERNETES_SERVICE_HOST is set) but the service account "
                f"configuration cannot be loaded: {exc}") from exc
        return configuration, "in-cluster service account"
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    if os.path.exists(default):
        return load(default, "kubeconfig"), f"kubeconfig {default}"
    return None, (f"no --kubeconfig or KUBECONFIG given, not in a pod (no "
                  f"KUBERNETES_SERVICE_HOST) and no {default}")


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WORDS = (("true", True), ("false", False), ("null", None))


def loads(data: bytes | str) -> Any:
    """JSON from the API server. orjson reads 1,024 levels, the API server stores
    custom resources nested up to 10,000 (``x-kubernetes-preserve-unknown-fields``): a
    tenant's WorkerPool 1,100 levels deep made every LIST of WorkerPools fail, so the
    watch never synced and the view went stale (readiness failed, rules that read it
    answered per the failure mode). Such documents are read by a loop instead."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            return _loads_deep(data.decode() if isinstance(data, bytes | bytearray) else data)
        except (ValueError, IndexError, UnicodeDecodeError):
            raise exc from None


def _loads_deep(s: str) -> Any:  # noqa: PLR0915
    """A JSON parser with an explicit stack (strings by the json module's scanner).

    Why one function of ~72 lines: one explicit-stack loop (any depth without recursion);
    split, it would pass the stack between calls on every token."""
    stack: list[tuple[Any, str | None]] = []
    pos = 0
    key: str | None

    def key_at(at: int) -> tuple[str, int]:
        if s[at] != '"':
            raise ValueError(f"expected a key at {at}")
        key, at = scanstring(s, at + 1, True)
        at = _WS.match(s, at).end()  # type: ignore[union-attr]
        if s[at] != ":":
            raise ValueError(f"expected ':' at {at}")
        return key, _WS.match(s, at + 1).end()  # type: ignore[union-attr]

    while True:
        pos = _WS.match(s, pos).end()  # type: ignore[union-attr]
        c = s[pos]
        value: Any
        if c == "{":
            pos = _WS.match(s, pos + 1).end()  # type: ignore[union-attr]
            if s[pos] != "}":
                key, pos = key_at(pos)
                stack.append(({}, key))
                continue
            value, pos = {}, pos + 1
        elif c == "[":
            pos = _WS.match(s, pos + 1).end()  # type: ignore[union-attr]
            if s[pos] != "]":
                stack.append(([], None))
                continue
            value, pos = [], pos + 1
        elif c == '"':
            value, pos = scanstring(s, pos + 1, True)
        else:
            number = _NUMBER.match(s, pos)
            if number and number.end() > pos:
                text = number.group()
                value = float(text) if number.group(1) or number.group(2) else int(text)
                pos = number.end()
            else:
                for word, meaning in _WORDS:
                    if s.startswith(word, pos):
                        value, pos = meaning, pos + len(word)
                        break
                else:
                    raise ValueError(f"unexpected {c!r} at {pos}")
        while True:  # put the value in its container; close the containers it ends
            if not stack:
                if _WS.match(s, pos).end() != len(s):  # type: ignore[union-attr]
                    raise ValueError(f"extra data at {pos}")
                return value
            container, key = stack[-1]
            if key is None:
                container.append(value)
            else:
                container[key] = value
            pos = _WS.match(s, pos).end()  # type: ignore[union-attr]
            if s[pos] == ",":
                pos = _WS.match(s, pos + 1).end()  # type: ignore[union-attr]
                if isinstance(container, dict):
                    key, pos = key_at(pos)
                    stack[-1] = (container, key)
                break
            if s[pos] != ("}" if isinstance(container, dict) else "]"):
                raise ValueError(f"expected ',' or a closing bracket at {pos}")
            pos += 1
            stack.pop()
            value = container


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


class KubeClient:
    """GET and streaming GET against the API server, with the client's auth and TLS."""

    def __init__(self, configuration: Configuration) -> None:
        self.configuration = configuration
        self.pool = RESTClientObject(configuration).pool_manager
        self.host = configuration.host.rstrip("/")

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "envelope"}
        auth = self.configuration.auth_settings().get("BearerToken")
        token = auth.get("value") if auth else None
        if token:
            headers["Authorization"] = token
        return headers

    def get(self, path: str, fields: dict[str, Any], timeout: float,
            stream: bool = False) -> urllib3.BaseHTTPResponse:
        response = self.pool.request(
            "GET", self.host + path, fields=fields, headers=self._headers(),
            preload_content=not stream,
            timeout=urllib3.Timeout(connect=5, read=timeout), retries=False)
        if response.status != 200:
            text = response.data.decode(errors="replace") if not stream else response.read(
                4096).decode(errors="replace")
            response.release_conn()
            raise ApiError(response.status, text)
        return response

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json", timeout: float = 10,
                accept: str = "application/json") -> dict[str, Any]:
        """A JSON request; raises :class:`ApiError` on any status but 2xx. ``accept``: a
        JSON media type the endpoint insists on (``/openid/v1/jwks`` answers 406 to
        anything but ``application/jwk-set+json``)."""
        headers = self._headers()
        headers["Accept"] = accept
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        response = self.pool.request(method, self.host + path, body=data, headers=headers,
                                     timeout=urllib3.Timeout(connect=5, read=timeout),
                                     retries=False)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, response.data.decode(errors="replace"))
        return loads(response.data) if response.data else {}


def pages(client: KubeClient, path: str, page_size: int = 500, timeout: float = 60
          ) -> Iterator[dict[str, Any]]:
    """Every page of a LIST, as the decoded body (``items``, ``metadata``), following
    ``metadata.continue`` until the last page: the one pagination loop (the live view,
    the audit, ``check --kubeconfig``). The caller reads one page at a time; errors
    (:class:`ApiError`, connection) propagate from the page that failed."""
    fields: dict[str, Any] = {"limit": page_size}
    while True:
        body = loads(client.get(path, fields, timeout).data)
        token = (body.get("metadata") or {}).get("continue")
        yield body
        if not token:
            return
        fields = {"limit": page_size, "continue": token}
