"""Byte sizes as users write them: `"24 GiB"`, `"512MiB"`, `"1.5 GB"`, `"1_140_000_000"` or an integer.

One parser for every size in every file kind and command-line option. Binary
units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (kB, MB, GB, TB)
powers of 1000; a bare number is bytes. The prefix is case-insensitive; the unit
must end in an upper-case `B`, because a lower-case `b` conventionally means bits.
"""

from __future__ import annotations

import re

UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}

# No device or artifact is anywhere near 1 PiB; a larger size is a typo (or an attack on the arithmetic).
MAX_BYTES = 1 << 50
# More digits than any size up to MAX_BYTES needs (whole or fraction): refused before int() reads them.
_MAX_DIGITS = 20

ACCEPTED_FORMS = ('an integer number of bytes, or a string such as "24 GiB", "512MiB", "1.5 GB", "250 kB" or '
                  '"1_140_000_000" (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), at most 1 PiB')

_SIZE = re.compile(r"^\s*(?P<number>\d[\d_]*(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A size that cannot be read; the message says what was found, `hint` the accepted forms."""

    hint = ACCEPTED_FORMS


def parse_size(value: object) -> int:
    """Return the number of bytes `value` denotes; raise SizeError otherwise."""
    if isinstance(value, bool):
        raise SizeError(f"a size must be a number of bytes or a string with a unit, not the boolean {value!r}")
    if isinstance(value, int):
        return _in_range(value, value)
    if isinstance(value, float):
        if not value.is_integer():
            raise SizeError(f"a size in bytes must be a whole number, not {value!r}")
        return _in_range(int(value), value)
    if not isinstance(value, str):
        raise SizeError(f"a size must be an integer or a string, not {type(value).__name__}")
    match = _SIZE.match(value)
    if match is None:
        raise SizeError(f"cannot read {_cut(value)} as a size")
    unit = match["unit"]
    multiplier = _unit_multiplier(unit, value)
    whole, _, fraction = match["number"].replace("_", "").partition(".")
    if len(whole) > _MAX_DIGITS:
        raise SizeError(f"{_cut(value)} is larger than {format_size(MAX_BYTES)}, more than any device or artifact")
    if len(fraction) > _MAX_DIGITS:
        raise SizeError(f"{_cut(value)} has more decimal places than any size needs")
    if fraction:
        total = (int(whole) * 10 ** len(fraction) + int(fraction)) * multiplier
        if total % 10 ** len(fraction):
            raise SizeError(f"{_cut(value)} is not a whole number of bytes")
        return _in_range(total // 10 ** len(fraction), value)
    return _in_range(int(whole) * multiplier, value)


def format_size(n_bytes: int) -> str:
    """The binary-unit rendering used in reports: `24.00 GiB`, `512.00 MiB`, `17 B`."""
    for unit, factor in (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n_bytes) >= factor:
            return f"{n_bytes / factor:.2f} {unit}"
    return f"{n_bytes} B"


def _unit_multiplier(unit: str, original: str) -> int:
    if unit.endswith("b"):
        raise SizeError(f"{original!r} ends in 'b', which means bits; write 'B' for bytes")
    multiplier = UNITS.get(unit.upper())
    if multiplier is None:
        raise SizeError(f"unknown size unit {unit!r} in {original!r}")
    return multiplier


def _in_range(n_bytes: int, original: object) -> int:
    if n_bytes < 0:
        raise SizeError(f"a size cannot be negative ({_cut(original)})")
    if n_bytes > MAX_BYTES:
        raise SizeError(f"{_cut(original)} is larger than {format_size(MAX_BYTES)}, more than any device or artifact")
    return n_bytes


def _cut(value: object, keep: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


# No accelerator or host offers less: a smaller device size is a number written without its unit.
SMALLEST_DEVICE = 1024**2


def parse_device_size(value: object) -> int:
    """A device's memory: a size of at least 1 MiB. A bare number is bytes, so `24` meant as GiB is refused with the
    fix rather than read as 24 B (which a plan then blames on the profile's context)."""
    size = parse_size(value)
    if size >= SMALLEST_DEVICE:
        return size
    unitless = isinstance(value, int) or (isinstance(value, str) and _SIZE.match(value) is not None
                                          and not _SIZE.match(value)["unit"])  # type: ignore[index]
    if unitless:
        raise SizeError(f"{value!r} has no unit, so it is {size} B: no device is that small; "
                        f'write the unit, e.g. "{str(value).strip()} GiB"')
    raise SizeError(f"{value!r} is {size} B: no device is smaller than 1 MiB")
