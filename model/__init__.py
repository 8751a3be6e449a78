"""The model side: engines, the model actor's thread, prompts and tool-call parsers.

Only this package imports MLX, and only after `mlxcel.model.provision.blas.load_fast_blas()`.
Getting a model and a fast BLAS in place beforehand is `mlxcel.model.provision`'s job.
"""
