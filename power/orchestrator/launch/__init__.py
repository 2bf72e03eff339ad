"""The pipeline's last floor: a plan out as launch files (`render`, with `templates/`), and a launch line back in
as a manifest and profile (`importer`: `tokens` -> each engine's reader -> `spec` -> `options`)."""
