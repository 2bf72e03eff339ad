"""The refusal every pull step raises: a finding with its code (PWR134-PWR140)."""

from __future__ import annotations

from power.findings import PowerError


class PullError(PowerError):
    """A file that could not be fetched, or whose bytes are not the ones the manifest names."""

    code = "PWR134"
