"""learners: GraphLearner, models, data readers and metrics; where decay and angelps meet."""
