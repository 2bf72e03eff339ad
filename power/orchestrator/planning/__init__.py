"""The pipeline's second floor: loaded files to a sealed plan (`resolve` the mode, `compile` with `checks/` and
each engine's adapter and sizer), a memo for planning many deployments, plans as text for people, and whether a
drafter is worth planning against the incumbent (`worth_it`)."""
