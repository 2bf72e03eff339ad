"""The pipeline's second floor: loaded files to a sealed plan (`resolve` the mode, `compile` with `checks/`,
`engines/` and `sizing/`), a memo for planning many deployments, and plans as text for people."""
