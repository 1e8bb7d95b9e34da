"""Leases, the sweeper and lost messages: worker deaths, clocks, fleets sharing a Redis."""
