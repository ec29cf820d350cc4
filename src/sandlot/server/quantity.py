"""Kubernetes resource quantities ("500m", "2Gi", "1.5") as used in ``resourceLimits``."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from sandlot.errors import InvalidRequest
from sandlot.server.codes import INVALID_PARAMETER

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?([a-zA-Z]*)\s*$")


def parse_quantity(value: str, what: str) -> Decimal:
    """Parse a quantity; ``what`` names the field in the 400 message."""
    match = _QUANTITY.match(str(value))
    if not match or match.group(3) not in _SUFFIXES:
        raise InvalidRequest(
            f"resourceLimits.{what}: {value!r} is not a valid quantity "
            "(examples: '500m', '2', '512Mi', '2Gi')",
            code=INVALID_PARAMETER,
        )
    number, exponent, suffix = match.groups()
    try:
        result = Decimal(number) * _SUFFIXES[suffix]
        if exponent:
            result *= Decimal(10) ** int(exponent)
    except InvalidOperation as exc:  # pragma: no cover - regex already restricts input
        raise InvalidRequest(
            f"resourceLimits.{what}: {value!r} is not a number", code=INVALID_PARAMETER
        ) from exc
    return result


def parse_cpu(value: str) -> float:
    cores = parse_quantity(value, "cpu")
    if cores <= 0:
        raise InvalidRequest(
            f"resourceLimits.cpu must be positive, got {value!r}", code=INVALID_PARAMETER
        )
    return float(cores)


def parse_memory(value: str) -> int:
    size = parse_quantity(value, "memory")
    if size < 4 * 2**20:
        raise InvalidRequest(
            f"resourceLimits.memory must be at least 4Mi, got {value!r}", code=INVALID_PARAMETER
        )
    return int(size)


# Smallest writable layer: an ext4 of its own (runtime/oci/disklimit.py) needs some metadata.
MIN_EPHEMERAL_STORAGE = 32 * 2**20


def parse_ephemeral_storage(value: str) -> int:
    """``resourceLimits["ephemeral-storage"]`` or its configured default, in bytes."""
    size = parse_quantity(value, "ephemeral-storage")
    if size < MIN_EPHEMERAL_STORAGE:
        raise InvalidRequest(
            f"resourceLimits.ephemeral-storage must be at least 32Mi, got {value!r}"
        )
    return int(size)


# Smallest pvc size: its ext4 of its own (runtime/oci/pvcdisk.py) needs some metadata.
MIN_PVC_STORAGE = 8 * 2**20


def parse_pvc_storage(volume: str, value: str) -> int:
    """A pvc volume's ``storage`` size (``"1Gi"``, ...), in bytes."""
    try:
        size = parse_quantity(value, "storage")
    except InvalidRequest as exc:
        raise InvalidRequest(f"volume {volume!r}: pvc storage {value!r} is not a valid "
                             "quantity (examples: '512Mi', '2Gi')",
                             code="VOLUME::INVALID_PVC_STORAGE") from exc
    if size < MIN_PVC_STORAGE:
        raise InvalidRequest(f"volume {volume!r}: pvc storage must be at least 8Mi, got "
                             f"{value!r}", code="VOLUME::INVALID_PVC_STORAGE")
    return int(size)
