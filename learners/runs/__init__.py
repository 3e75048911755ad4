"""A run's outputs: run folders, console and metrics log, progress, plots, retention, export."""
