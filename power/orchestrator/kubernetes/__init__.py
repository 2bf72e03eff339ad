"""Kubernetes renders: the objects of a placed plan, a fleet's placements, and the base + rollout overlay tree (a whole
fleet's: `power.orchestrator.fleet.kubernetes`)."""
