"""The promise against faults nobody scripted."""
