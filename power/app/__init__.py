"""The application: the CLI and its commands, outputs, the A/B harness, live engines, sweeps, conformance."""
