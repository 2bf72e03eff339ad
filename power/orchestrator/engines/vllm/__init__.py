"""Everything Power knows about vLLM: its adapter, settings table, argument dispositions, sizing, launch-line reader
and live-bench record (docs/architecture.md, "Where an engine's knowledge lives")."""
