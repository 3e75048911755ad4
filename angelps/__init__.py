"""angelps: the parameter server (tables, shards, optimizers, client, checkpoints, config).

The public face is imported lazily (PEP 562), so that ``import angelps.options`` loads only the
standard library and the key layer (``angelconf``, shared with ``decay``): the CLI's config-only
verbs rely on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from angelps.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "PSClient": "angelps.client.ps_client",
    "ParameterShard": "angelps.server.shard",
    "TableSpec": "angelps.table",
    "OptimizerSpec": "angelps.table",
    "PSOptions": "angelps.options",
    "load_config": "angelps.options",
    "Config": "angelconf.config",
    "ConfigError": "angelconf.config",
    "Key": "angelconf.config",
}

__all__ = [
    "Config",
    "ConfigError",
    "Key",
    "OptimizerSpec",
    "PSClient",
    "PSOptions",
    "ParameterShard",
    "TableSpec",
    "load_config",
]

if TYPE_CHECKING:
    from angelconf.config import Config, ConfigError, Key
    from angelps.client.ps_client import PSClient
    from angelps.options import PSOptions, load_config
    from angelps.server.shard import ParameterShard
    from angelps.table import OptimizerSpec, TableSpec


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
