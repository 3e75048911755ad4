"""The optimizers: one interface (slots and update), the built-in six, and their registry."""
