"""The check catalogue's artifact-dependent families, one module per family.

artifacts (PWR1xx declared vs file), drafters (PWR2xx), tokenizer (PWR3xx),
speculation (PWR4xx that need artifacts), memory (PWR5xx). Each module exports
functions that take loaded documents and artifact facts and return findings.
"""
