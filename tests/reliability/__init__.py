"""v1 delivery: one completion callback per rollout through worker freezes and other faults."""
