"""Redis trouble: outages, restarts, failover, and a Redis that can lose rollouts."""
