"""v1 delivery: every admitted rollout ends with one completion callback."""
