"""The worker side of the PS: PSClient, routing keys to shards, the data plane, recovery."""
