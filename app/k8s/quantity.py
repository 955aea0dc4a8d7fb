"""Exact Kubernetes quantities.

Quantities are parsed into :class:`decimal.Decimal` so that ``1Gi == 1024Mi`` and
``0.1 + 0.2 == 0.3`` hold exactly; nothing here ever rounds through a float.
The grammar follows ``k8s.io/apimachinery/pkg/api/resource``: a signed decimal
number followed by a binary-SI suffix (Ki..Ei), a decimal-SI suffix (n, u, m, k,
M, G, T, P, E) or a decimal exponent (``e3``, ``E-2``).
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_UP, Context, Decimal
from functools import lru_cache

from app.k8s.util import Memo, plain_number

__all__ = ["QuantityError", "format_bytes", "format_cpu", "format_units", "parse_quantity", "shown"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_DEC_SUFFIX_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN_SUFFIX_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_INT64 = re.compile(r"^[+-]?[0-9]+$")
_MAX_INT64 = 2**63 - 1
_NANO_SCALE = 9
# Quantity.UnmarshalJSON applies Go's strings.TrimSpace to the *raw* JSON string
# bytes, without unescaping them. Go's encoder (kubectl's) writes \t \n \v \f \r
# and U+2028/U+2029 as escapes, which are then not spaces but "\t" and fail to
# parse; the other Unicode spaces are written as they are and trimmed. So these
# are the spaces a quantity may carry (the quantity oracle checks each).
_GO_SPACE = " \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
    "\u202f\u205f\u3000"


SHOWN = 40
"""Characters of a written value a message repeats."""


def shown(value: object) -> str:
    """``repr(value)`` for a message, cut to about :data:`SHOWN` characters: a value of
    300,000 digits is named by its start and its length, not copied into the answer
    (and from there into the API server's error and the logs)."""
    if isinstance(value, str) and len(value) > SHOWN:
        return f"{value[:SHOWN]!r}... ({len(value):,} characters)"
    if isinstance(value, (str, int, float, bool, type(None))):
        text = repr(value)
        return text if len(text) <= SHOWN + 2 else f"{text[:SHOWN]}... ({len(text):,} characters)"
    text = str(value)
    return f"{type(value).__name__} {text if len(text) <= SHOWN else text[:SHOWN] + '...'}"


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says why."""

    reason: str = ""


NEWEST_MINOR = 37
"""The Kubernetes minor whose parsing and defaulting the rules model (the newest
supported, docs/upstream.md); the version-matrix oracles pass the API server's own."""

#: Significant digits ParseQuantity keeps from v1.38 (apimachinery v0.38.0-beta.0
#: ``pkg/api/resource/quantity.go`` ``maxSignificantDigits`` and
#: ``maxBinarySISignificantDigits``); before 1.38 every digit is kept.
_MAX_DIGITS_138 = 29
_MAX_BINARY_DIGITS_138 = 70


def parse_quantity(value: object, *, minor: int = NEWEST_MINOR) -> Decimal:
    """Return the exact value of a quantity (``"1.5Gi"``, ``"250m"``, ``7``, ``"1e3"``)
    as the API server stores it: ``k8s.io/apimachinery/pkg/api/resource``
    ``Quantity.UnmarshalJSON`` / ``ParseQuantity`` at v0.34.12, including its
    corner cases (``"+"``, ``"."`` and ``"1."`` are quantities; ``" 1 "`` is, as
    JSON, after TrimSpace; a decimal exponent is an int64 truncated to int32;
    values below one nano round up, away from zero, to 1n; binary-suffixed values
    are capped at 2^63-1). Very large exponents cost nothing: the value is built
    from its digits and exponent, never by repeated multiplication. ``minor`` 38 and
    later: the slow path keeps at most 29 significant digits (70 before a binary
    suffix), rounding what it drops away from zero (``decFromDigits``)."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got {shown(value)}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return _parse_cached(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity, got {shown(value)}")
    # Cached: a cluster uses few distinct quantity strings, and Decimals are immutable.
    # Short strings by count; long ones (a CRD quantity reaches the webhook as written,
    # possibly megabytes of digits) by their total length, so each is parsed once per
    # review however many rules read it, and the cache cannot hold more than
    # LONG_BUDGET bytes, the strings and their values measured (util.Memo).
    if minor >= 38:
        return _parse_text(value, minor)
    if len(value) <= 64:
        return _parse_cached(value)
    found = _long.get(value)
    if found is None:
        found = _long.put(value, _parse_text(value))
    return found


def _bad(value: str, why: str) -> QuantityError:
    """The refusal; ``why`` is kept on the exception (``.reason``), the message is
    the one every rule has always shown."""
    err = QuantityError(f"{shown(value)} is not a quantity (examples: 500m, 2, 1.5Gi, 29G, 1e3)")
    err.reason = why
    return err


def _int32(n: int) -> int:
    """Go's int32(n): two's-complement truncation."""
    n &= 0xFFFFFFFF
    return n - 2**32 if n >= 2**31 else n


_ZEROS = re.compile(r"0*")
_DIGIT_RUN = re.compile(r"[0-9]*")
_SUFFIX_RUN = re.compile(r"[eEinumkKMGTP]*")


def _end(run: re.Pattern[str], text: str, pos: int) -> int:
    """Where ``run`` (a starred class: it always matches, perhaps empty) stops from ``pos``."""
    found = run.match(text, pos)
    return found.end() if found is not None else pos


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """quantity.go parseQuantityString: (positive, value, num, denom, suffix). Each run
    of characters is one regular-expression match, so the scan is linear in the length
    and runs at C speed (a 300,000-digit value is scanned in about a millisecond)."""
    positive, pos, end = True, 0, len(text)
    if end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    i = _end(_ZEROS, text, pos)
    if i >= end:
        return positive, "0", "0", "", ""
    pos = i
    i = _end(_DIGIT_RUN, text, pos)
    if i >= end:
        return positive, text, text[pos:], "", ""
    num, pos = text[pos:i] or "0", i
    denom = ""
    if text[pos] == ".":
        pos += 1
        i = _end(_DIGIT_RUN, text, pos)
        if i >= end:
            return positive, text, num, text[pos:], ""
        denom, pos = text[pos:i], i
    value, start = text[:pos], pos
    i = _end(_SUFFIX_RUN, text, pos)
    if i >= end:
        return positive, value, num, denom, text[start:]
    pos = i + 1 if text[i] in "+-" else i
    i = _end(_DIGIT_RUN, text, pos)
    if i >= end:
        return positive, value, num, denom, text[start:]
    raise _bad(text, "it must be a number with an optional suffix")


#: scaleb without rounding: a context as wide as any exponent a quantity can have.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _inf_dec(value: str) -> tuple[Decimal, int] | None:
    """gopkg.in/inf.v0 Dec.SetString: (unscaled, scale), or None. The unscaled value is
    an integral Decimal built from the digit string: decimal digits go into a Decimal in
    time linear in their number, where a Python int would cost quadratic time (and
    ``int(str)`` refuses more than 4,300 digits)."""
    sign = "-" if value[:1] == "-" else ""
    body = value[1:] if value[:1] in "+-" else value
    whole, _, frac = body.partition(".")
    digits = whole + frac
    if not digits:
        return None
    return Decimal(sign + digits), len(frac)


def _from_scaled(unscaled: Decimal | int, scale: int) -> Decimal:
    """unscaled * 10**-scale, exactly, without arithmetic."""
    return Decimal(unscaled).scaleb(-scale, _EXACT)


def _exponent(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64) truncated to int32, as quantitySuffixer.interpret
    reads ``e<exponent>``; None where ParseInt fails (not an int64). Leading zeros are
    dropped before any conversion, so ``e`` + 300,000 zeros + ``3`` is 3 at no cost."""
    if not _INT64.match(text):
        return None
    negative = text[0] == "-"
    body = text.lstrip("+-").lstrip("0") or "0"
    if len(body) > 19:
        return None
    n = -int(body) if negative else int(body)
    return _int32(n) if -(2**63) <= n <= _MAX_INT64 else None


def _significant(unscaled: Decimal, max_digits: int) -> tuple[Decimal, int]:
    """decFromDigits of 1.38: at most ``max_digits`` significant digits, a dropped
    non-zero digit rounding the rest away from zero; (unscaled, digits dropped)."""
    magnitude = unscaled.copy_abs()
    dropped = magnitude.adjusted() + 1 - max_digits
    if magnitude == 0 or dropped <= 0:
        return unscaled, 0
    kept = magnitude.scaleb(-dropped, _EXACT).to_integral_value(ROUND_UP, _EXACT)
    return (kept if unscaled > 0 else kept.copy_negate()), dropped


def _suffix_exponent(value: str, suffix: str) -> int:
    """The exponent a suffix stands for: decimal (``k``, ``M``, ``m``...: of 10), binary
    (``Ki``, ``Mi``...: of 2) or ``e``/``E`` with a number (of 10)."""
    if suffix in _DEC_SUFFIX_EXP:
        return _DEC_SUFFIX_EXP[suffix]
    if suffix in _BIN_SUFFIX_EXP:
        return _BIN_SUFFIX_EXP[suffix]
    if len(suffix) > 1 and suffix[0] in "eE" and (parsed := _exponent(suffix[1:])) is not None:
        return parsed
    raise _bad(value, f"unknown suffix {suffix!r}")


def _parse_text(value: str, minor: int = NEWEST_MINOR) -> Decimal:
    text = value.strip(_GO_SPACE)
    if not text:
        raise _bad(value, "it is empty")
    if text == "0":
        return Decimal(0)
    positive, number, num, denom, suffix = _split(text)
    binary = suffix in _BIN_SUFFIX_EXP
    exponent = _suffix_exponent(value, suffix)
    # The int64 fast path of ParseQuantity (same value as the slow path, except
    # that it skips the binary cap, which it can only reach without overflow). It
    # takes at most 18 digits, so the int conversion here is cheap.
    if binary:
        precision = 15 - len(num) - (exponent * 3 // 10) - 1 if not denom else -1
        scale = 0
        mantissa = 1 << exponent
    else:
        precision = 18 - (len(num) + len(denom))
        scale = exponent
        mantissa = 1
    if precision >= 0:
        scale = _int32(scale - len(denom))
        if scale >= -_NANO_SCALE:
            result = int(num + denom) * mantissa
            if result <= _MAX_INT64:
                return _from_scaled(result if positive else -result, -scale)
    # The inf.Dec slow path, in Decimal arithmetic only (linear in the digits: no
    # conversion between binary and decimal of a long value, see _inf_dec).
    parsed = _inf_dec(number)
    if parsed is None:
        raise _bad(value, "it has no digits")
    unscaled, dec_scale = parsed
    if minor >= 38:
        unscaled, dropped = _significant(unscaled, _MAX_BINARY_DIGITS_138 if binary else _MAX_DIGITS_138)
        dec_scale = _int32(dec_scale - dropped)
    if binary:
        unscaled = _EXACT.multiply(unscaled, Decimal(1 << exponent))
    else:
        dec_scale = _int32(dec_scale + _int32(-exponent))
    if unscaled != 0 and dec_scale > _NANO_SCALE:
        # Round up, away from zero, to a multiple of 1n: ParseQuantity's first limit
        # on what matters (digits past the ninth decimal only decide "round up").
        shift = dec_scale - _NANO_SCALE
        magnitude = unscaled.copy_abs()  # copy_*: no rounding to the default context
        if magnitude.adjusted() < shift:  # below 1n (also for shifts of 2^31)
            magnitude = Decimal(1)
        else:
            magnitude = magnitude.scaleb(-shift, _EXACT).to_integral_value(ROUND_UP, _EXACT)
        unscaled = magnitude if unscaled > 0 else magnitude.copy_negate()
        dec_scale = _NANO_SCALE
    amount = _from_scaled(unscaled, dec_scale)
    # The binary cap (maxAllowed), on the magnitude: its second limit (a binary value
    # of more than 19 integer digits is 2^63-1, whatever the digits).
    if binary and amount.copy_abs() > _MAX_INT64:
        return Decimal(_MAX_INT64 if amount > 0 else -_MAX_INT64)
    return amount


_parse_cached = lru_cache(maxsize=4096)(_parse_text)
LONG_BUDGET = 6 * 2**20
"""Bytes of long (over 64 characters) quantity strings kept parsed, with their values
(``util.footprint``: about 1.4 bytes a digit): more than all the quantities of one
review (the body is at most a few MiB, and an UPDATE's two objects share their
unchanged values)."""
_long: Memo[str, Decimal] = Memo(1024, LONG_BUDGET)


def clear_long_cache() -> None:
    """Forget the long strings parsed so far (for benchmarks of a first parse)."""
    _long.clear()


# Beyond 10**30, messages show a value in scientific notation: no unit reads better,
# and plain formatting of ``1e2147483647`` would be 2 GB of digits.
def _huge(value: Decimal) -> bool:
    return value.is_finite() and value != 0 and value.adjusted() > 30


def format_bytes(value: Decimal) -> str:
    """Readable bytes for messages: the largest binary unit that divides exactly."""
    if _huge(value):
        return f"{value:E}"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value != 0 and value % unit == 0:
            return f"{plain_number(value / unit)}{suffix}"
    if abs(value) >= 2**30:
        return f"{plain_number((value / 2**30).quantize(Decimal('0.01')))}Gi"
    return plain_number(value)


def format_cpu(value: Decimal) -> str:
    """Readable CPU for messages: whole cores as ``7``, fractions as ``250m``."""
    if _huge(value):
        return f"{value:E}"
    if value == value.to_integral_value():
        return plain_number(value)
    return f"{plain_number(value * 1000)}m"


def format_units(resource: str, units: int) -> str:
    """A resource's amount in the integer units the scheduler counts (mCPU for ``cpu``,
    bytes for memory, ephemeral storage and hugepages, a count otherwise), as messages
    show it: ``7``, ``250m``, ``29Gi``, ``2``."""
    if resource == "cpu":
        return format_cpu(Decimal(units) / 1000)
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return format_bytes(Decimal(units))
    return str(units)
