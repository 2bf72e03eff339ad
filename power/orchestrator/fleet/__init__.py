"""Fleets: review, the lock, drift, profile rollouts, evidence and the HTML report."""
