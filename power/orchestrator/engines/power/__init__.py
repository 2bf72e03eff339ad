"""Everything Power knows about its own runtime as an engine: its adapter (settings table, command line) and its
sizing (docs/architecture.md, "Where an engine's knowledge lives")."""
