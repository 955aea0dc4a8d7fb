from decimal import Decimal

import pytest

from app.quantity import QuantityError, format_bytes, format_cpu, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", Decimal(7)),
        ("250m", Decimal("0.25")),
        ("0.5", Decimal("0.5")),
        (".5", Decimal("0.5")),
        ("1k", Decimal(1000)),
        ("1Ki", Decimal(1024)),
        ("1Mi", Decimal(2**20)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("2Ti", Decimal(2 * 2**40)),
        ("1Pi", Decimal(2**50)),
        ("1Ei", Decimal(2**60)),
        ("29G", Decimal(29 * 10**9)),
        ("1M", Decimal(10**6)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("100n", Decimal("1e-7")),
        ("3u", Decimal("3e-6")),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("5e-3", Decimal("0.005")),
        ("+2", Decimal(2)),
        (" 2Gi ", Decimal(2 * 2**30)),
        (3, Decimal(3)),
        (0.5, Decimal("0.5")),
    ],
)
def test_parse(text: object, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_binary_and_decimal_units_compare_exactly() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")
    assert parse_quantity("1G") != parse_quantity("1Gi")
    assert parse_quantity("1") == parse_quantity("1000m")
    assert parse_quantity("100m") + parse_quantity("200m") == parse_quantity("300m")


@pytest.mark.parametrize("bad", ["", "   ", "1GB", "1gi", "one", "1.2.3", "1e", "--1", True, None,
                                 [], {"a": 1}, "1 Gi", "1K", "1ee3", "1e-", "1Ki5", ".e-10", "+e-10",
                                 "1e99999999999999999999", "\x1c1", float("inf"),
                                 "\t2", "2\n", "\u20282"])
def test_rejects(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_format() -> None:
    assert format_bytes(parse_quantity("29Gi")) == "29Gi"
    assert format_bytes(parse_quantity("1536Mi")) == "1536Mi"
    assert format_cpu(parse_quantity("7")) == "7"
    assert format_cpu(parse_quantity("250m")) == "250m"


def test_long_quantity_strings_are_not_cached() -> None:
    from app import quantity as module

    before = module._parse_cached.cache_info().currsize
    assert parse_quantity("0" * 100 + "1Gi") == 1024**3
    assert module._parse_cached.cache_info().currsize == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # ParseQuantity's own corner cases (apimachinery resource/quantity.go,
        # v0.34.12); the quantity oracle (e2e/test_oracle_quantity.py) checks each
        # against the API server.
        ("+", Decimal(0)),
        ("-", Decimal(0)),
        (".", Decimal(0)),
        ("1.", Decimal(1)),
        ("1.G", Decimal(10**9)),
        ("Gi", Decimal(0)),
        ("m", Decimal(0)),
        ("e3", Decimal(0)),
        ("1E", Decimal(10**18)),
        ("1e+3", Decimal(1000)),
        ("0.1n", Decimal("1e-9")),  # below one nano: rounded up to 1n
        ("1e-10", Decimal("1e-9")),
        ("-1e-10", Decimal("-1e-9")),
        ("0e-10", Decimal(0)),
        ("9Ei", Decimal(2**63 - 1)),  # binary values are capped at 2^63-1
        ("100Ei", Decimal(2**63 - 1)),
        ("0.0000000001Ki", Decimal("1.03e-7")),
        ("123456789012345678901234567890", Decimal("123456789012345678901234567890")),
        # The exponent is an int64 truncated to int32, as Go's int32(parsed).
        ("1e4294967296", Decimal(1)),
        ("1e9999999999", Decimal("1e1410065407")),
        ("1e-2147483648", Decimal("1e2147483648")),
        ("1e-2147483647", Decimal("1e-9")),
        ("\u00a02\u3000", Decimal(2)),  # Go's TrimSpace (JSON) takes Unicode spaces
    ],
)
def test_parse_quantity_corner_cases(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_huge_values_are_exact_and_formatted_briefly() -> None:
    value = parse_quantity("1e999999999")
    assert value == Decimal("1e999999999") and value > parse_quantity("1e999999998")
    assert format_bytes(value) == "1E+999999999"
    assert format_cpu(value) == "1E+999999999"
