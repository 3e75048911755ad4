"""A training worker: its actor and group, the step, dense layers, device, cache, feed."""
