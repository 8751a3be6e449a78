"""Provisioning: what the runtime needs before it starts, never used while serving.

A fast BLAS routed under MLX on Linux (`blas`), and the embedded default model
obtained from the package index and converted from GGUF to an MLX folder once
(`fetch`, `gguf_convert`, `gguf_tokenizer`), both kept in the per-user cache.
"""
