"""Exact Kubernetes quantities.

Quantities are parsed into :class:`decimal.Decimal` so that ``1Gi == 1024Mi`` and
``0.1 + 0.2 == 0.3`` hold exactly; nothing here ever rounds through a float.
The grammar follows ``k8s.io/apimachinery/pkg/api/resource``: a signed decimal
number followed by a binary-SI suffix (Ki..Ei), a decimal-SI suffix (n, u, m, k,
M, G, T, P, E) or a decimal exponent (``e3``, ``E-2``).
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from functools import lru_cache

from app.util import plain_number

__all__ = ["QuantityError", "format_bytes", "format_cpu", "parse_quantity"]

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
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
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


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says why."""

    reason: str = ""


def parse_quantity(value: object) -> Decimal:
    """Return the exact value of a quantity (``"1.5Gi"``, ``"250m"``, ``7``, ``"1e3"``)
    as the API server stores it: ``k8s.io/apimachinery/pkg/api/resource``
    ``Quantity.UnmarshalJSON`` / ``ParseQuantity`` at v0.34.12, including its
    corner cases (``"+"``, ``"."`` and ``"1."`` are quantities; ``" 1 "`` is, as
    JSON, after TrimSpace; a decimal exponent is an int64 truncated to int32;
    values below one nano round up, away from zero, to 1n; binary-suffixed values
    are capped at 2^63-1). Very large exponents cost nothing: the value is built
    from its digits and exponent, never by repeated multiplication."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return _parse_cached(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity, got {type(value).__name__} {value!r}")
    # Cached: a cluster uses few distinct quantity strings, and Decimals are immutable;
    # long strings are not, so a caller cannot make the cache hold megabytes.
    return _parse_cached(value) if len(value) <= 64 else _parse_text(value)


def _bad(value: str, why: str) -> QuantityError:
    """The refusal; ``why`` is kept on the exception (``.reason``), the message is
    the one every rule has always shown."""
    err = QuantityError(f"{value!r} is not a quantity (examples: 500m, 2, 1.5Gi, 29G, 1e3)")
    err.reason = why
    return err


def _int32(n: int) -> int:
    """Go's int32(n): two's-complement truncation."""
    n &= 0xFFFFFFFF
    return n - 2**32 if n >= 2**31 else n


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """quantity.go parseQuantityString: (positive, value, num, denom, suffix)."""
    positive, pos, end = True, 0, len(text)
    if end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    i = pos
    while i < end and text[i] == "0":
        i += 1
    if i >= end:
        return positive, "0", "0", "", ""
    pos = i
    while i < end and text[i] in _DIGITS:
        i += 1
    if i >= end:
        return positive, text, text[pos:], "", ""
    num, pos = text[pos:i] or "0", i
    denom = ""
    if text[pos] == ".":
        pos += 1
        i = pos
        while i < end and text[i] in _DIGITS:
            i += 1
        if i >= end:
            return positive, text, num, text[pos:], ""
        denom, pos = text[pos:i], i
    value, start = text[:pos], pos
    i = pos
    while i < end and text[i] in _SUFFIX_CHARS:
        i += 1
    if i >= end:
        return positive, value, num, denom, text[start:]
    pos = i + 1 if text[i] in "+-" else i
    i = pos
    while i < end and text[i] in _DIGITS:
        i += 1
    if i >= end:
        return positive, value, num, denom, text[start:]
    raise _bad(text, "it must be a number with an optional suffix")


#: scaleb without rounding: a context as wide as any exponent a quantity can have.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _inf_dec(value: str) -> tuple[int, int] | None:
    """gopkg.in/inf.v0 Dec.SetString: (unscaled, scale), or None."""
    sign = -1 if value[:1] == "-" else 1
    body = value[1:] if value[:1] in "+-" else value
    whole, _, frac = body.partition(".")
    digits = whole + frac
    if not digits:
        return None
    # int(Decimal(...)), not int(str): Python refuses str -> int beyond 4,300 digits,
    # and the API server takes quantities of any length.
    return sign * int(Decimal(digits)), len(frac)


def _from_scaled(unscaled: int, scale: int) -> Decimal:
    """unscaled * 10**-scale, exactly, without arithmetic."""
    return Decimal(unscaled).scaleb(-scale, _EXACT)


def _parse_text(value: str) -> Decimal:
    text = value.strip(_GO_SPACE)
    if not text:
        raise _bad(value, "it is empty")
    if text == "0":
        return Decimal(0)
    positive, number, num, denom, suffix = _split(text)
    binary = suffix in _BIN_SUFFIX_EXP
    if suffix in _DEC_SUFFIX_EXP:
        exponent = _DEC_SUFFIX_EXP[suffix]
    elif binary:
        exponent = _BIN_SUFFIX_EXP[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and _INT64.match(suffix[1:]) \
            and -(2**63) <= int(suffix[1:]) <= _MAX_INT64:
        exponent = _int32(int(suffix[1:]))
    else:
        raise _bad(value, f"unknown suffix {suffix!r}")
    # The int64 fast path of ParseQuantity (same value as the slow path, except
    # that it skips the binary cap, which it can only reach without overflow).
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
            result = int(Decimal(num + denom)) * mantissa
            if result <= _MAX_INT64:
                return _from_scaled(result if positive else -result, -scale)
    # The inf.Dec slow path.
    parsed = _inf_dec(number)
    if parsed is None:
        raise _bad(value, "it has no digits")
    unscaled, dec_scale = parsed
    if binary:
        unscaled <<= exponent
    else:
        dec_scale = _int32(dec_scale + _int32(-exponent))
    if unscaled != 0 and dec_scale > _NANO_SCALE:
        # Round up, away from zero, to a multiple of 1n.
        shift = dec_scale - _NANO_SCALE
        magnitude = abs(unscaled)
        if Decimal(magnitude).adjusted() < shift:
            magnitude = 1
        else:
            q, r = divmod(magnitude, 10**shift)
            magnitude = q + (1 if r else 0)
        unscaled = magnitude if unscaled > 0 else -magnitude
        dec_scale = _NANO_SCALE
    # The binary cap (maxAllowed), on the magnitude; the scale is at most 9 here.
    if binary and abs(unscaled) > _MAX_INT64 * 10**dec_scale:
        unscaled, dec_scale = (_MAX_INT64 if unscaled > 0 else -_MAX_INT64), 0
    return _from_scaled(unscaled, dec_scale)


_parse_cached = lru_cache(maxsize=4096)(_parse_text)


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
