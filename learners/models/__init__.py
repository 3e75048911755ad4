"""The models: the zoo, their configuration, their PS tables, the pulled rows as input."""
