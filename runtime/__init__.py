"""The runtime: loading artifacts, training, tuning, the tuning cache."""
