"""The model side: engines, the model actor's thread, prompts, and the fast BLAS (`blas`).

Only this package imports MLX, and only after `mlxcel.model.blas.load_fast_blas()`.
Getting a model in place beforehand is `mlxcel.model.provision`'s job.
"""
