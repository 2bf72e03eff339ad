"""Power's orchestrator: TOML schema, GGUF inspection, checks, sizing, plans, rendering, fleet, CLI."""
