"""A job on the driver: GraphLearner, its actors, cluster, placement, checks, failover."""
