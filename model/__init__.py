"""The model side: engines, the model actor's thread, prompts, and model files.

Only this package imports MLX, and only after `mlxcel.model.blas.load_fast_blas()`.
"""
