"""Kubernetes quantities as the API server reads them (``resource.Quantity``).

The emulated API server must accept and refuse exactly what a real one does: a signed decimal,
optionally with a decimal exponent (``1e3``) or one binary or decimal SI suffix (``Ki`` ...
``Ei``, ``n``, ``u``, ``m``, ``k`` ... ``E``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_GRAMMAR = re.compile(
    r"^(?P<sign>[+-]?)(?P<digits>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<exp>[eE][+-]?[0-9]+)|(?P<si>[numkMGTPE]))?$"
)
_BINARY = {p + "i": Decimal(2) ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")}
_SI = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse(value: Any) -> Decimal:
    """The quantity ``value`` (a string or a number) in base units.

    Raises:
        ValueError: ``quantities must match the regular expression ...``, as the API server says.
    """
    text = str(value).strip()
    found = _GRAMMAR.match(text)
    if found is None:
        raise ValueError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {text!r})"
        )
    try:
        number = Decimal(found["sign"] + found["digits"])
    except InvalidOperation:  # pragma: no cover - the grammar admits decimals only
        raise ValueError(f"not a number (got {text!r})") from None
    if found["binary"]:
        return number * _BINARY[found["binary"]]
    if found["exp"]:
        return number.scaleb(int(found["exp"][1:]))
    return number * _SI[found["si"]] if found["si"] else number
