"""`power bench`: the A/B harness and everything around it (docs/bench.md)."""
