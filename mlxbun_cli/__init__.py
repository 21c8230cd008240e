"""mlxbun: local language models on MLX as a daily tool."""

from mlxbun_cli import import_cache

__version__ = "0.1.0"

import_cache.install()  # before anything imports transformers (through mlx_lm)
