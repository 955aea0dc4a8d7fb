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


@pytest.mark.parametrize("bad", ["", "Gi", "1GB", "1gi", "one", "1.2.3", "1e", "--1", True, None,
                                 [], {"a": 1}, "1 Gi"])
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
