"""The pipeline's last floor: a plan out as launch files (`render`, with `templates/`), and a launch line back in
as a manifest and profile (`importer`: `inputs.launch_lines.tokens` -> each engine's reader -> `spec` ->
`options`)."""
