"""A launch line read in, in words no engine owns: its located tokens, what it asks for in Power's terms, and what
becomes of each option (carried, refused or of no effect). Each engine's `reader.py` is built on them; the pipeline
that turns a line into a profile is `power.orchestrator.launch.importer`."""
