"""Checkpoints and backups: table files, the manifest, local and object-store commits."""
