"""The fleet as an operator runs it: the CLI, ``up``, probes, metrics, tracing, logs."""
