"""Typed argument records of the big commands: what a command was asked, parsed and checked in one place (each
combination of options that cannot run is a usage error here), as terraform's `internal/command/arguments` does; the
click command is the glue that builds the record and runs it."""
