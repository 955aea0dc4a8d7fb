"""Exact Kubernetes quantities.

Quantities are parsed into :class:`decimal.Decimal` so that ``1Gi == 1024Mi`` and
``0.1 + 0.2 == 0.3`` hold exactly; nothing here ever rounds through a float.
The grammar follows ``k8s.io/apimachinery/pkg/api/resource``: a signed decimal
number followed by a binary-SI suffix (Ki..Ei), a decimal-SI suffix (n, u, m, k,
M, G, T, P, E) or a decimal exponent (``e3``, ``E-2``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
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
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says why."""


def parse_quantity(value: object) -> Decimal:
    """Return the exact value of a quantity (``"1.5Gi"``, ``"250m"``, ``7``, ``"1e3"``)."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity, got {type(value).__name__} {value!r}")
    # Cached: a cluster uses few distinct quantity strings, and Decimals are immutable;
    # long strings are not, so a caller cannot make the cache hold megabytes.
    return _parse_cached(value) if len(value) <= 64 else _parse_text(value)


def _parse_text(value: str) -> Decimal:
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity (examples: 500m, 2, 1.5Gi, 29G, 1e3)")
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{value!r} is not a quantity") from exc
    if match["bin"]:
        return number * _BINARY[match["bin"]]
    if match["exp"]:
        return number.scaleb(int(match["exp"][1:]))
    return number * _DECIMAL[match["dec"] or ""]


_parse_cached = lru_cache(maxsize=4096)(_parse_text)


def format_bytes(value: Decimal) -> str:
    """Readable bytes for messages: the largest binary unit that divides exactly."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value != 0 and value % unit == 0:
            return f"{plain_number(value / unit)}{suffix}"
    if abs(value) >= 2**30:
        return f"{plain_number((value / 2**30).quantize(Decimal('0.01')))}Gi"
    return plain_number(value)


def format_cpu(value: Decimal) -> str:
    """Readable CPU for messages: whole cores as ``7``, fractions as ``250m``."""
    if value == value.to_integral_value():
        return plain_number(value)
    return f"{plain_number(value * 1000)}m"
