"""angelps: the parameter server (tables, shards, optimizers, client, checkpoints, config)."""

__version__ = "0.1.0"
