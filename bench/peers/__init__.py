"""The peers section of the benchmark (see harness.py)."""
