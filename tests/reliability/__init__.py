"""Issue 14: the promise against faults nobody scripted (one module per group of findings)."""
