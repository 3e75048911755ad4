"""Row storage of a shard: the key index, the rows and their optimizer state, admission."""
