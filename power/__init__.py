"""Power: declarative speculative-decoding deployments of GGUF models."""

__version__ = "0.1.0"

# Before anything imports torch: OpenMP reads its wait policy once, when torch loads it (power.threads).
from power.threads import settle_wait_policy  # noqa: E402

settle_wait_policy()
