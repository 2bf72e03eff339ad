"""Speculators behind one interface (`base`); `registry` is the only place that knows which exist."""
