"""The shard side: ParameterShard, its Ray actor (ShardServer), clocks, launching shards."""
