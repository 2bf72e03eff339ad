"""Power: declarative speculative-decoding deployments of GGUF models."""

__version__ = "0.1.0"
