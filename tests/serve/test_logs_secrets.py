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
import contextlib
import io
import json
import logging
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from app.core.config import Policy
from app.render import FORMATS
from app.serve.server import create_app
from tests.conftest import RULES, container, run, workload

TOKEN = "sk-secret-123"
PIN = "918273645"  # a secret that is also a quantity: its number must not be shown either
SECRETS = (TOKEN, PIN)


def _env(limits: str | None, requests: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "TOKEN", "value": TOKEN}, {"name": "PIN", "value": PIN},
                                 {"name": "CHAINED", "value": "x-$(TOKEN)"},
                                 {"name": "CPUPAIR", "value": f"cpu={PIN}n"},
                                 {"name": "SPEC", "value": f"cpu=7,memory=1Gi,token={TOKEN}"}]
    if limits is not None:
        out.append({"name": "RESOURCE_LIMITS", "value": limits})
    if requests is not None:
        out.append({"name": "RESOURCE_REQUESTS", "value": requests})
    return out


# (case, RESOURCE_LIMITS, RESOURCE_REQUESTS, the severity the case must produce, a fragment
# the message must hold: it names the variable instead of its value)
CASES = [
    ("cpu not a quantity", None, "cpu=$(TOKEN),memory=1Gi", "error", "cpu from $(TOKEN) is not a quantity"),
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
    ("cpu below request", "$(CPUPAIR),memory=1Gi", "cpu=7,memory=1Gi", "error",
     "RESOURCE_LIMITS cpu from $(CPUPAIR) is below RESOURCE_REQUESTS cpu=7"),
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
    from app.k8s.envexpand import Source, container_env, expand_tracked
    text, sources = expand_tracked("a$(X)b$$(X)$(Y)$(Z)", {"X": "xx", "Y": ""}.get)
    assert text == "axxb$(X)$(Z)"
    assert sources == (Source(1, 3, "X"), Source(8, 8, "Y"))
    seen = container_env([{"name": "T", "value": "tok"}, {"name": "L", "value": "memory=$(T)"}])["L"]
    assert seen.value == "memory=tok" and seen.sources == (Source(7, 10, "T"),)


def test_pairs_know_where_their_value_lies() -> None:
    from app.rules.envelope import PairError, parse_envelope_string
    envelope = parse_envelope_string(" cpu = 7 ,, memory=29Gi ")
    assert [envelope.raw[slice(*p.span)] for p in envelope.pairs] == ["7", "29Gi"]
    with pytest.raises(PairError) as caught:
        parse_envelope_string("a=1, bogus ,c=2")
    assert caught.value.span == (5, 10)


# --- logged fields are capped (3 MB reviews wrote 57 MiB of log in half a second) ---

def _lines(err: str, marker: str) -> list[str]:
    return [line for line in err.splitlines() if marker in line]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_review_with_megabyte_uid_name_and_namespace_logs_under_4_kib(
        path: str, capsys: pytest.CaptureFixture[str]) -> None:
    size = 600_000  # five of them (uid, name and namespace twice): a 3 MB review
    uid, name, namespace = "u" * size, "n" * size, "s" * size
    env = [{"name": "RESOURCE_LIMITS", "value": "memory=1Gi"},
           {"name": "RESOURCE_REQUESTS", "value": "memory=2Gi"}]
    obj = workload("Deployment", [container(limits={"cpu": "1", "memory": "1Gi"}, env=env)],
                   name=name, namespace=namespace)
    review = _review(obj, uid)
    review["request"].update(name=name, namespace=namespace)
    answer = _post(create_app(RULES, Policy()), path, review)
    assert answer["uid"] == uid  # the answer still carries the whole uid
    logged = _lines(capsys.readouterr().err, '"logger":"envelope.admission"')
    assert len(logged) == 1
    line = logged[0]
    assert len(line.encode()) < 4096, len(line)
    record = json.loads(line)
    assert record["uid"].startswith("u" * 128) and record["uid"].endswith(
        "…[cut: 600,000 characters]")
    assert record["name"] == "n" * 253 + "…[cut: 600,000 characters]"
    assert record["namespace"] == "s" * 63 + "…[cut: 600,000 characters]"
    assert record["decision"] == {"/mutate": "patch", "/validate": "deny"}[path]


def test_a_megabyte_kind_is_capped_too(capsys: pytest.CaptureFixture[str]) -> None:
    review = _review({"metadata": {"name": "x"}}, "u-kind")
    review["request"]["kind"] = {"group": "g" * 1_000_000, "version": "v1", "kind": "K" * 1_000_000}
    answer = _post(create_app(RULES, Policy()), "/validate", review)
    assert answer["uid"] == "u-kind" and answer["allowed"] is True
    [line] = _lines(capsys.readouterr().err, '"u-kind"')
    assert len(line.encode()) < 4096


def _formatted(record: logging.LogRecord) -> str:
    from app.serve.logs import JsonFormatter
    return JsonFormatter().format(record)


def test_every_logging_call_is_capped() -> None:
    """Fields, the message, the uid and a traceback quoting an object: each bounded."""
    from app.serve.logs import FIELD_LIMITS, LINE_LIMIT
    big = "x" * 3_000_000
    try:
        raise KeyError(big)
    except KeyError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("envelope.test", logging.ERROR, __file__, 1, "rule %s failed",
                               (big,), exc_info)
    record.fields = {"error": big, "nested": {"deep": ["y" * 1000] * 40}, big: 1}  # type: ignore[attr-defined]
    record.uid = big  # type: ignore[attr-defined]
    line = _formatted(record)
    assert len(line.encode()) <= LINE_LIMIT
    data = json.loads(line)
    assert data["msg"].endswith("…[cut: 3,000,012 characters]")
    assert len(data["uid"]) < FIELD_LIMITS["uid"] + 40
    assert len(data["exception"]) < FIELD_LIMITS["exception"] + 40
    assert "KeyError" in data["exception"]
    assert data["nested"]["deep"][-1] == "…[24 more]"
    assert data["error"] == "x" * 256 + "…[cut: 3,000,000 characters]"


def test_a_line_of_many_wide_fields_stays_under_the_line_limit() -> None:
    """Characters JSON writes six bytes wide, in every field at its limit: the line is
    written again with its short scalars, naming what it dropped."""
    from app.serve.logs import LINE_LIMIT, admission_log
    wide = "\x00" * 100_000
    fields: dict[str, Any] = {f"f{i}": wide for i in range(40)}
    fields.update(uid="u-wide", decision="deny", name=wide, message=wide)
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        admission_log.write(fields)
    line = captured.getvalue().strip()
    assert len(line.encode()) <= LINE_LIMIT
    data = json.loads(line)
    assert data["uid"] == "u-wide" and data["decision"] == "deny" and "dropped:" in data["cut"]


# --- what an object holds reaches a message only cut (audit of class 5) ---

BIG = 2_000_000
BOUNDED_CASES = {
    # a CRD or a file keeps a quantity as written; the message quoted it whole, twice
    "bad quantity": container(limits={"memory": "x" * BIG}, requests={"memory": "1Gi"}),
    "long container name": container(name="c" * BIG, limits={"cpu": "1", "memory": "1Gi"},
                                     requests={"memory": "2Gi"}),
    "long resource name": container(limits={"k" * BIG: "x"}, requests={"memory": "2Gi"}),
    "deep value": container(limits={"memory": {"a": {"b": ["v" * 1000] * 1000}}}),
}


@pytest.mark.parametrize("case", BOUNDED_CASES)
def test_a_megabyte_value_makes_a_denial_of_a_few_kib(case: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    obj = workload("Deployment", [BOUNDED_CASES[case]])
    answer = _post(create_app(RULES, Policy()), "/validate", _review(obj, "u-big"))
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert len(message) < 8192, len(message)  # was 2-4 MB: the value, once per error
    assert message.endswith("]")  # the rule id, after the cut
    if case != "deep value":  # that one is described by its type, never quoted
        # cut by the Finding cap, or named by its start and length (quantity.shown)
        assert "…[cut: " in message or "(2,000,000 characters)" in message
    lines = _lines(capsys.readouterr().err, '"u-big"')
    assert lines and all(len(line.encode()) < 4096 for line in lines), [x[:300] for x in lines]


def test_findings_keep_their_beginning_and_end() -> None:
    from app.rules.base import MESSAGE_LIMIT, PATH_LIMIT, error
    finding = error("spec." + "p" * 10_000, "container: " + "v" * 10_000 + " is not a quantity")
    assert len(finding.message) <= MESSAGE_LIMIT and len(finding.path) <= PATH_LIMIT
    assert finding.message.startswith("container: ") and finding.message.endswith(
        " is not a quantity")
    assert "…[cut: 10,029 characters]…" in finding.message


def test_an_internal_error_quoting_the_object_is_cut(capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from app.core.ruleset import RuleSet

    def crash(subject: Any, obj: Any, view: Any, policy: Any) -> Any:
        raise ValueError(f"cannot read {obj['metadata']['name']}")  # a bug quoting the object

    crashing = RuleSet([replace(r, fn=crash) if r.id == "memory-limit" else r
                        for r in RULES.values()], RULES.copiers, updates=RULES.updates)
    obj = workload("Deployment", [container()], name="n" * BIG)
    answer = _post(create_app(crashing, Policy(failure_mode="deny")), "/mutate",
                   _review(obj, "u-crash"))
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    message = answer["status"]["message"]
    assert "memory-limit: ValueError: cannot read nnn" in message and len(message) < 1024
    for line in _lines(capsys.readouterr().err, "u-crash"):
        assert len(line.encode()) < 8192


def test_envelope_check_output_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [dict(workload("Deployment", [c]), metadata={"name": f"w{i}", "namespace": "team-a"})
            for i, c in enumerate(BOUNDED_CASES.values())]
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    for output in FORMATS:
        code = main(["check", "-o", output, "-f", str(path)])
        out = capsys.readouterr()
        assert code != 0
        if output == "json":  # it carries the patch, whose annotation names the container
            for entry in json.loads(out.out)["objects"]:
                for finding in entry["findings"] + entry["changes"]:
                    assert len(finding["message"]) <= 1024 and len(finding["path"]) <= 512
        elif output == "sarif":  # the rules' help (docs/rules) is fixed text: bound the results
            results = json.loads(out.out)["runs"][0]["results"]
            assert len(json.dumps(results)) + len(out.err) < 64 * 1024, output
        else:
            assert len(out.out) + len(out.err) < 64 * 1024, (output, len(out.out))


def test_the_loggers_serve_writes_with_all_go_through_the_caps(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``serve`` sets the root handler once; uvicorn's loggers propagate to it (uvicorn
    runs with ``log_config=None``), so their lines are capped too."""
    from app.serve.logs import setup_logging
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info")
        for name in ("uvicorn.error", "envelope.engine", "envelope.cluster"):
            logging.getLogger(name).warning("bad request %s", "r" * 3_000_000,
                                            extra={"fields": {"path": "/" + "p" * 3_000_000}})
        lines = [line for line in capsys.readouterr().err.splitlines() if "bad request" in line]
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert len(lines) == 3
    for line in lines:
        assert len(line.encode()) < 2048
