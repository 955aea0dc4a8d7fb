"""app/k8s/envexpand.py: the kubelet's $(VAR) expansion (class 6).

UPSTREAM_CASES is doExpansionTest of Kubernetes v1.34.12 (ported then)
third_party/forked/golang/expansion/expand_test.go, copied as data."""

from __future__ import annotations

import pytest

from app.k8s.envexpand import EnvValue, container_env, expand, references

CONTEXT = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}

UPSTREAM_CASES = [
    ('whole string', '$(VAR_A)', 'A'),
    ('repeat', '$(VAR_A)-$(VAR_A)', 'A-A'),
    ('beginning', '$(VAR_A)-1', 'A-1'),
    ('middle', '___$(VAR_B)___', '___B___'),
    ('end', '___$(VAR_C)', '___C'),
    ('compound', '$(VAR_A)_$(VAR_B)_$(VAR_C)', 'A_B_C'),
    ('escape & expand', '$$(VAR_B)_$(VAR_A)', '$(VAR_B)_A'),
    ('compound escape', '$$(VAR_A)_$$(VAR_B)', '$(VAR_A)_$(VAR_B)'),
    ('mixed in escapes', 'f000-$$VAR_A', 'f000-$VAR_A'),
    ('backslash escape ignored', 'foo\\$(VAR_C)bar', 'foo\\Cbar'),
    ('backslash escape ignored', 'foo\\\\$(VAR_C)bar', 'foo\\\\Cbar'),
    ('lots of backslashes', 'foo\\\\\\\\$(VAR_A)bar', 'foo\\\\\\\\Abar'),
    ('nested var references', '$(VAR_A$(VAR_B))', '$(VAR_A$(VAR_B))'),
    ('nested var references second type', '$(VAR_A$(VAR_B)', '$(VAR_A$(VAR_B)'),
    ('value is a reference', '$(VAR_REF)', '$(VAR_A)'),
    ('value is a reference x 2', '%%$(VAR_REF)--$(VAR_REF)%%', '%%$(VAR_A)--$(VAR_A)%%'),
    ('empty var', 'foo$(VAR_EMPTY)bar', 'foobar'),
    ('unterminated expression', 'foo$(VAR_Awhoops!', 'foo$(VAR_Awhoops!'),
    ('expression without operator', 'f00__(VAR_A)__', 'f00__(VAR_A)__'),
    ('shell special vars pass through', '$?_boo_$!', '$?_boo_$!'),
    ('bare operators are ignored', '$VAR_A', '$VAR_A'),
    ('undefined vars are passed through', '$(VAR_DNE)', '$(VAR_DNE)'),
    ('multiple (even) operators, var undefined', '$$$$$$(BIG_MONEY)', '$$$(BIG_MONEY)'),
    ('multiple (even) operators, var defined', '$$$$$$(VAR_A)', '$$$(VAR_A)'),
    ('multiple (odd) operators, var undefined', '$$$$$$$(GOOD_ODDS)', '$$$$(GOOD_ODDS)'),
    ('multiple (odd) operators, var defined', '$$$$$$$(VAR_A)', '$$$A'),
    ('missing open expression', '$VAR_A)', '$VAR_A)'),
    ('shell syntax ignored', '${VAR_A}', '${VAR_A}'),
    ('trailing incomplete expression not consumed', '$(VAR_B)_______$(A', 'B_______$(A'),
    ('trailing incomplete expression, no content, is not consumed', '$(VAR_C)_______$(', 'C_______$('),
    ('operator at end of input string is preserved', '$(VAR_A)foobarzab$', 'Afoobarzab$'),
    ('shell escaped incomplete expr', 'foo-\\$(VAR_A', 'foo-\\$(VAR_A'),
    ('lots of $( in middle', '--$($($($($--', '--$($($($($--'),
    ('lots of $( in beginning', '$($($($($--foo$(', '$($($($($--foo$('),
    ('lots of $( at end', 'foo0--$($($($(', 'foo0--$($($($('),
    ('escaped operators in variable names are not escaped', '$(foo$$var)', '$(foo$$var)'),
    ('newline not expanded', '\n', '\n'),
    ('dollar sign followed by non-ASCII UTF-8 character', '$£FOO', '$£FOO'),
    ('dollar sign followed by multi-byte UTF-8 character in middle', 'prefix-$€-suffix', 'prefix-$€-suffix'),
    ('dollar sign followed by Chinese character', '$中文', '$中文'),
]


@pytest.mark.parametrize(("name", "text", "expected"), UPSTREAM_CASES, ids=[c[0] for c in UPSTREAM_CASES])
def test_expand_matches_upstream(name: str, text: str, expected: str) -> None:
    assert expand(text, CONTEXT.get) == expected

def test_map_reference_upstream() -> None:
    """TestMapReference: entries see the ones before them."""
    env = [{"name": "FOO", "value": "bar"}, {"name": "ZOO", "value": "$(FOO)-1"},
           {"name": "BLU", "value": "$(ZOO)-2"}]
    got = container_env(env)
    assert {k: v.value for k, v in got.items()} == {"FOO": "bar", "ZOO": "bar-1", "BLU": "bar-1-2"}


def test_last_duplicate_wins_and_sees_the_earlier_one() -> None:
    env = [{"name": "CPU", "value": "7"}, {"name": "CPU", "value": "$(CPU)500m"}]
    assert container_env(env)["CPU"] == EnvValue("7500m")
    env = [{"name": "ENVELOPE", "value": "cpu=1"}, {"name": "ENVELOPE", "value": "cpu=2"}]
    assert container_env(env)["ENVELOPE"].value == "cpu=2"


def test_later_entries_are_not_visible_and_stay_literal() -> None:
    env = [{"name": "A", "value": "$(B)x"}, {"name": "B", "value": "1"}]
    got = container_env(env)
    assert got["A"] == EnvValue("$(B)x", ("B",))
    assert got["B"] == EnvValue("1")


def test_escape_and_value_from() -> None:
    env = [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
           {"name": "T", "value": "$(S)-x"}, {"name": "U", "value": "$$(S)"}, {"name": "E", "value": ""}]
    got = container_env(env)
    assert got["S"].value is None and got["T"].value is None
    assert got["U"].value == "$(S)"
    assert got["E"].value == ""


def test_env_from_is_seen_first() -> None:
    got = container_env([{"name": "X", "value": "$(FROM_CM)"}], env_from={"FROM_CM": "v", "SECRET": None})
    assert got["X"].value == "v"
    assert container_env([{"name": "X", "value": "$(SECRET)"}], env_from={"SECRET": None})["X"].value is None


def test_unresolved_references_travel_with_the_value() -> None:
    """B takes A's value, $(X) still in it: B's value holds an unresolved reference too."""
    got = container_env([{"name": "A", "value": "$(X)"}, {"name": "B", "value": "m=$(A)"}])
    assert got["B"] == EnvValue("m=$(X)", ("X",))


@pytest.mark.parametrize(("text", "names"), [
    ("cpu=1", ()),
    ("$(A)-$(B)-$(A)", ("A", "B")),
    ("$$(A)", ()),  # an escape, not a reference
    ("$$$(A)", ("A",)),
    ("$(A", ()),  # unterminated: literal
    ("$(A$(B))", ("A$(B",)),  # not nested: the name runs to the first ")"
])
def test_references(text: str, names: tuple[str, ...]) -> None:
    assert references(text) == names
