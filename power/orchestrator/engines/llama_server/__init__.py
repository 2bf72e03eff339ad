"""Everything Power knows about llama-server: its adapter, settings table, option table and dispositions, sizing,
launch-line reader and live-bench record (docs/architecture.md, "Where an engine's knowledge lives")."""
