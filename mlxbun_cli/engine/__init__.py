"""The generation core: model loading and one continuous-batching scheduler per model.

This package imports mlx lazily; `mlxbun_cli.engine.types` is import-light.
"""
