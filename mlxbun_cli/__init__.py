"""mlxbun: local language models on MLX as a daily tool."""

__version__ = "0.1.0"
