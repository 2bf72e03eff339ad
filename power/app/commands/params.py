"""Click parameter types the commands share: numbers that must be finite (click's FloatRange lets NaN and
infinity through, since no comparison with NaN fails)."""

from __future__ import annotations

import math

import click


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and +-inf."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
