"""Admission and polling on the gateways: bad input, limits, replicas, replication."""
