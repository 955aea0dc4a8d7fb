"""Issue 25, class 5: what messages and logs say is bounded and never holds a value
another env var put into a string envelope through ``$(VAR)`` expansion.

The secrets below are referenced from RESOURCE_LIMITS / RESOURCE_REQUESTS in every
position that produces a message (an invalid quantity, a bad pair, a memory mismatch, a
CPU limit under the request, the mutating rule's "keeps its cpu pair" warning, an
unresolved reference next to a resolved one); each case is judged by the engine, by the
HTTP handler (response and log line) and by ``envelope check`` in every output format.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from app.config import Policy
from app.reports import FORMATS
from app.server import create_app
from tests.conftest import RULES, container, run, workload

TOKEN = "sk-secret-123"
PIN = "918273645"  # a secret that is also a quantity: its number must not be shown either
SECRETS = (TOKEN, PIN)


def _env(limits: str | None, requests: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "TOKEN", "value": TOKEN}, {"name": "PIN", "value": PIN},
                                 {"name": "CHAINED", "value": "x-$(TOKEN)"},
                                 {"name": "SPEC", "value": f"cpu=7,memory=1Gi,token={TOKEN}"}]
    if limits is not None:
        out.append({"name": "RESOURCE_LIMITS", "value": limits})
    if requests is not None:
        out.append({"name": "RESOURCE_REQUESTS", "value": requests})
    return out


# (case, RESOURCE_LIMITS, RESOURCE_REQUESTS, the severity the case must produce, a fragment
# the message must hold: it names the variable instead of its value)
CASES = [
    ("cpu not a quantity", "cpu=$(TOKEN),memory=1Gi", None, "error", "cpu from $(TOKEN) is not a quantity"),
    ("memory not a quantity", "memory=$(TOKEN)", None, "error", "memory from $(TOKEN) is not a quantity"),
    ("memory part-expanded", "memory=1$(TOKEN)Gi", None, "error", "memory from $(TOKEN) is not a quantity"),
    ("chained reference", "memory=$(CHAINED)", None, "error", "memory from $(CHAINED) is not a quantity"),
    ("the whole envelope", "$(TOKEN)", None, "error", "from $(TOKEN) is not a key=value pair"),
    ("a pair", "cpu=7,$(TOKEN)", None, "error", "from $(TOKEN) is not a key=value pair"),
    ("requests side", None, "memory=$(TOKEN)", "error", "memory from $(TOKEN) is not a quantity"),
    ("memory mismatch", "memory=$(PIN)", "memory=1Gi", "error",
     "RESOURCE_LIMITS memory from $(PIN) differs from RESOURCE_REQUESTS memory=1Gi"),
    ("memory mismatch, requests side", "memory=1Gi", "memory=$(PIN)", "error",
     "memory=1Gi differs from RESOURCE_REQUESTS memory from $(PIN)"),
    ("cpu below request", "cpu=$(PIN)n,memory=1Gi", "cpu=7,memory=1Gi", "error",
     "RESOURCE_LIMITS cpu from $(PIN) is below RESOURCE_REQUESTS cpu=7"),
    ("keeps its cpu pair", "$(SPEC)", None, "warning", "(after expanding $(SPEC)) keeps its cpu pair"),
    ("unresolved next to resolved", "cpu=$(TOKEN),memory=$(UNDEFINED)", None, "warning",
     "$(UNDEFINED) is not resolved"),
]
IDS = [c[0] for c in CASES]


def _obj(limits: str | None, requests: str | None) -> dict[str, Any]:
    return workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"},
                                             env=_env(limits, requests))])


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


@pytest.mark.parametrize(("case", "limits", "requests", "severity", "fragment"), CASES, ids=IDS)
def test_the_engine_names_the_variable_never_its_value(case: str, limits: str | None,
                                                       requests: str | None, severity: str,
                                                       fragment: str) -> None:
    result = run(_obj(limits, requests))
    said = [f.message for f in result.findings]
    assert any(fragment in m for m in said), said
    assert any(f.severity == severity for f in result.findings if fragment in f.message)
    _clean(json.dumps(said))


def _review(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                        "operation": "CREATE", "namespace": "team-a", "name": "web", "object": obj}}


def _post(app: Any, path: str, review: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post(path, content=json.dumps(review),
                                         headers={"content-type": "application/json"})
        assert response.status_code == 200
        return dict(response.json()["response"])
    return asyncio.run(go())


@pytest.mark.parametrize(("case", "limits", "requests", "severity", "fragment"), CASES, ids=IDS)
def test_the_webhook_answer_and_log_line_hold_no_expanded_value(
        case: str, limits: str | None, requests: str | None, severity: str, fragment: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = create_app(RULES, Policy())
    obj = _obj(limits, requests)
    said = []
    for path in ("/mutate", "/validate"):
        answer = _post(app, path, _review(obj, f"u-{path}"))
        answer.pop("patch", None)  # the patch carries object values by design
        said.append(json.dumps(answer))
    logged = capsys.readouterr().err
    assert '"u-/validate"' in logged  # the log line was written (and captured)
    assert any(fragment in text or json.dumps(fragment)[1:-1] in text for text in said), said
    _clean("\n".join(said))
    _clean(logged)


@pytest.mark.parametrize("output", FORMATS)
def test_envelope_check_prints_no_expanded_value(output: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    docs = [dict(_obj(limits, requests), metadata={"name": f"w{i}", "namespace": "team-a"})
            for i, (_, limits, requests, _, _) in enumerate(CASES)]
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code = main(["check", "-o", output, "-f", str(path)])
    out = capsys.readouterr()
    assert code != 0  # the errors above were reported
    assert "$(TOKEN)" in out.out
    _clean(out.out + out.err)


# Pieces of a string envelope as written: never the snowman, which only the secrets hold,
# so the snowman in a message can only have come from an expanded value.
_PIECES = st.sampled_from(["cpu=", "memory=", "cpu", "memory", "=", ",", " ", "7", "1Gi", "500m",
                           "Gi", "m", "x", "$(S1)", "$(S2)", "$(S3)", "$(UNDEF)", "$$", "$"])
_SECRET_TEXT = st.text(st.sampled_from("☃=,7Gim. x-"), max_size=12).map(lambda t: "☃" + t)


@settings(max_examples=400, deadline=None)
@given(limits=st.lists(_PIECES, max_size=8).map("".join),
       requests=st.lists(_PIECES, max_size=8).map("".join),
       s1=_SECRET_TEXT, s2=st.sampled_from(["1Gi", "7", "☃", "cpu=1", "memory=2Gi,☃=1", ""]),
       s3=st.sampled_from(["$(S1)", "x$(S2)", "cpu=☃"]))
def test_no_expanded_value_reaches_any_message(limits: str, requests: str, s1: str, s2: str,
                                               s3: str) -> None:
    """Whatever the envelopes and wherever the secrets sit, no finding shows them."""
    env = [{"name": "S1", "value": s1}, {"name": "S2", "value": s2}, {"name": "S3", "value": s3},
           {"name": "RESOURCE_LIMITS", "value": limits},
           {"name": "RESOURCE_REQUESTS", "value": requests}]
    result = run(workload("Deployment", [container(env=env)]))
    for finding in result.findings:
        assert "☃" not in finding.message, finding.message


def test_sources_say_where_each_value_lies() -> None:
    from app.envexpand import Source, container_env, expand_tracked
    text, sources = expand_tracked("a$(X)b$$(X)$(Y)$(Z)", {"X": "xx", "Y": ""}.get)
    assert text == "axxb$(X)$(Z)"
    assert sources == (Source(1, 3, "X"), Source(8, 8, "Y"))
    seen = container_env([{"name": "T", "value": "tok"}, {"name": "L", "value": "memory=$(T)"}])["L"]
    assert seen.value == "memory=tok" and seen.sources == (Source(7, 10, "T"),)


def test_pairs_know_where_their_value_lies() -> None:
    from app.envelope import PairError, parse_envelope_string
    envelope = parse_envelope_string(" cpu = 7 ,, memory=29Gi ")
    assert [envelope.raw[slice(*p.span)] for p in envelope.pairs] == ["7", "29Gi"]
    with pytest.raises(PairError) as caught:
        parse_envelope_string("a=1, bogus ,c=2")
    assert caught.value.span == (5, 10)
