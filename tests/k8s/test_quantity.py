import itertools
import random
import re
import sys
import time
from decimal import Decimal

import pytest

from app.k8s import quantity as quantity_module
from app.k8s.quantity import QuantityError, format_bytes, format_cpu, parse_quantity


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


def test_long_quantity_strings_stay_out_of_the_count_bounded_cache() -> None:
    from app.k8s import quantity as module

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


# --- long strings: linear time, and the value of ParseQuantity's big.Int path ---------
#
# The reference below is quantity.go ParseQuantity's slow path written with Python ints
# (big.Int as inf.Dec uses them): unscaled * 2^exp or scale += -exp, Round(9, RoundUp),
# the binary cap. It is what app/k8s/quantity.py computed before it moved to Decimal
# arithmetic (quadratic in the digits, fine for the few thousand digits used here) and
# what the e2e quantity oracle checks against the API server.

def _reference(text: str) -> Decimal:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        match = re.fullmatch(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)", text)
        assert match is not None
        sign, whole, frac, suffix = match.group(1), match.group(2), match.group(3) or "", match.group(4)
        binary = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
        decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
                   "E": 18}
        if suffix in decimal:
            exponent = decimal[suffix]
        elif suffix in binary:
            exponent = binary[suffix]
        else:
            exponent = int(suffix[1:])
            assert -(2**63) <= exponent < 2**63
            exponent = (exponent + 2**31) % 2**32 - 2**31
        unscaled, scale = int(whole + frac or "0"), len(frac)
        if sign == "-":
            unscaled = -unscaled
        if suffix in binary:
            unscaled <<= exponent
        else:
            scale = (scale - exponent + 2**31) % 2**32 - 2**31
        if unscaled and scale > 9:
            magnitude, shift = abs(unscaled), scale - 9
            magnitude = -(-magnitude // 10**shift) if shift < len(str(magnitude)) + 1 else 1
            unscaled, scale = (magnitude if unscaled > 0 else -magnitude), 9
        value = Decimal(unscaled).scaleb(-scale, quantity_module._EXACT)
        if suffix in binary and abs(value) > 2**63 - 1:
            value = Decimal(2**63 - 1 if value > 0 else -(2**63 - 1))
        return value
    finally:
        sys.set_int_max_str_digits(limit)


def _long_cases() -> list[str]:
    rng = random.Random(25)
    cases = []
    suffixes = ["", "n", "u", "m", "k", "M", "G", "T", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                "e3", "e-3", "e-40", "e40", "e-2000", "e+2500", "e0000000000000000000000000007",
                "e-" + "0" * 5000 + "12", "E9"]
    for _ in range(300):
        whole = rng.choice(["", "0" * rng.randint(1, 3000), str(rng.randint(1, 9))]) + \
            "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 5, 19, 20, 40, 700, 3000])))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 0, 3, 9, 10, 30, 2500])))
        number = whole + ("." + frac if frac or rng.random() < 0.1 else "")
        text = rng.choice(["", "", "-", "+"]) + number + rng.choice(suffixes)
        if len(text) > 64 and any(c.isdigit() for c in number):
            cases.append(text)
    return cases


@pytest.mark.parametrize("text", _long_cases())
def test_long_strings_have_the_value_of_the_big_int_path(text: str) -> None:
    assert parse_quantity(text) == _reference(text)


@pytest.mark.parametrize("text", ["1" * 300_000, "1" * 300_000 + "Gi", "0." + "1" * 300_000,
                                  "1" * 300_000 + "e-5", "-" + "9" * 300_000 + "m",
                                  "1." + "1" * 300_000 + "Ki", "0" * 300_000 + "1",
                                  "1e-" + "0" * 300_000 + "3", "1" * 300_000 + "e2147483647"])
def test_300000_digits_parse_in_linear_time(text: str) -> None:
    # Before: 4-7 s each on the 2-core CI machine (quadratic int <-> decimal
    # conversions); now about 2 ms. The bound (0.5 s) is 100 times that, safe on a
    # loaded machine, and 8 times below the old figure.
    sign = text[:1] if text[:1] in "+-" else ""
    fresh = sign + "0" * next(_FRESH) + text[len(sign):]  # same value, a cold parse (not a hit)
    start = time.perf_counter()
    value = parse_quantity(fresh)
    assert time.perf_counter() - start < 0.5
    assert value == parse_quantity(text)


_FRESH = itertools.count(1)


def test_an_exponent_with_thousands_of_leading_zeros_is_read_as_parseint_reads_it() -> None:
    # Before: int() refused more than 4,300 digits (a ValueError, not a QuantityError).
    assert parse_quantity("1e" + "0" * 5000 + "3") == 1000
    assert parse_quantity("1e-" + "0" * 5000 + "3") == Decimal("0.001")
    with pytest.raises(QuantityError):
        parse_quantity("1e1" + "0" * 5000)  # beyond int64: ParseInt fails, ErrSuffix


def test_long_strings_are_parsed_once_and_the_cache_is_bounded_by_length() -> None:
    module = quantity_module
    text = "1" * 100_000 + "Mi"
    first = parse_quantity(text)
    assert parse_quantity("" + text[:]) is first  # a hit: the same Decimal, not a reparse
    for i in range(60):
        parse_quantity(str(i) + "0" * 100_000)
    assert module._long.weight <= module.LONG_BUDGET
    assert len(module._long) <= module.LONG_BUDGET // 100_000


@pytest.mark.parametrize("seed", range(4))
def test_exponents_of_thousands_of_digits_are_refused_or_read_as_parseint_reads_them(seed: int) -> None:
    # Issue 28, class 8: ParseQuantity reads e<digits> with strconv.ParseInt(.., 10, 64);
    # past int64 it fails (ErrSuffix). Never anything but a value or a QuantityError.
    rng = random.Random(seed)
    for _ in range(25):
        zeros = "0" * rng.choice([0, 1, 4000, 5000])
        digits = str(rng.randrange(1, 10)) + "".join(rng.choice("0123456789")
                                                     for _ in range(rng.choice([0, 2, 17, 18, 30, 4000])))
        sign = rng.choice(["", "+", "-"])
        text = f"3e{sign}{zeros}{digits}"
        n = int(digits) * (-1 if sign == "-" else 1) if len(digits) <= 19 else None
        if n is None or not -(2**63) <= n <= 2**63 - 1:
            with pytest.raises(QuantityError):
                parse_quantity(text)
            continue
        exponent = ((n + 2**31) % 2**32) - 2**31  # Go's int32() of the int64
        # below 1n, a value rounds up to 1n (ParseQuantity's inf.RoundUp at Nano)
        expected = Decimal("1e-9") if exponent < -9 else Decimal(3).scaleb(exponent, quantity_module._EXACT)
        assert parse_quantity(text) == expected, text


def test_from_1_38_the_slow_path_keeps_29_significant_digits() -> None:
    # apimachinery v0.38.0-beta.0 decFromDigits (maxSignificantDigits 29, 70 before a
    # binary suffix), as the long-string quantity oracle found the v1.38.0-beta.0 API
    # server storing them: 3859820828169697796801345564143555898206 -> ...5564200G.
    text = "3859820828169697796801345564143555898206"
    assert parse_quantity(text) == Decimal(text)
    assert parse_quantity(text, minor=38) == Decimal("3859820828169697796801345564200e9")
    assert parse_quantity("-" + text, minor=38) == Decimal("-3859820828169697796801345564200e9")
    # dropped zeros round nothing; 29 digits or fewer, and the int64 fast path, are as before
    assert parse_quantity("1" + "0" * 39, minor=38) == Decimal("1e39")
    for same in ("12345678901234567890123456789", "1.5Gi", "250m", "123456789012345678"):
        assert parse_quantity(same, minor=38) == parse_quantity(same)
    # before a binary suffix 70 digits are kept (the cap at 2^63-1 decides first)
    assert parse_quantity("0." + "1" * 40 + "Ki", minor=38) == parse_quantity("0." + "1" * 40 + "Ki")
