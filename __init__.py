"""mlxcel: local MLX language models behind the OpenAI Responses API."""

__version__ = "0.1.0"
