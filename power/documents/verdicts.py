"""What a bench verdict means, shared by the bench that writes it and the rollout gate that reads it.

A candidate is "faster" when its median decode rate is at least NOISE_BAND above the
baseline's and the two min-max ranges do not overlap (docs/bench.md); "slower" the other
way round; otherwise "no difference".
"""

from __future__ import annotations

NOISE_BAND = 0.05  # a median ratio within 5 % of 1 is "no difference"
