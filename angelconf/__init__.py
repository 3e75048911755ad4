"""The configuration key layer that decay and angelps share: ``.properties`` parsing
(:mod:`angelconf.properties`) and key declarations, checks and loading (:mod:`angelconf.config`).

Standard library only, and imports nothing of the project: it sits below both decay (which
imports only the standard library and this layer) and angelps.
"""
