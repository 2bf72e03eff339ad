"""Kubernetes renders: the objects of a placed plan, a fleet's placements, and the base + rollout overlay tree."""
