"""Fleets: review, the lock, drift, profile rollouts, evidence, the HTML report, and a fleet rendered for Kubernetes."""
