"""Standalone experiments, each its own ``python -m`` command: the conformance
matrix over other servers, structured outputs at scale, tenants, budgets shared
through Redis, and the server's gauges under a saturating map."""
