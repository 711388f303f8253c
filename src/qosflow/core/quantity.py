"""Kubernetes quantities (``2Gi``, ``500m``, ``1.5G``): the amounts a pod requests, as numbers.

A job spec's ``memory_per_unit`` and the Argo client's reading of pods' requests and nodes'
capacity share this one reading (imported from :mod:`qosflow.core.spec` too, where it began).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(
    r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity such as ``2Gi``, ``500m`` or ``1.5G``.

    Args:
        text: The quantity string.

    Returns:
        The value in base units.

    Raises:
        ValueError: When the string is not a Kubernetes quantity.
    """
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity like 2Gi or 512Mi (got {text!r})")
    try:
        return Decimal(match["num"]) * _SUFFIX[match["suffix"]]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"not a number (got {text!r})") from exc
