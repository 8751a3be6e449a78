"""The model side: engines, the model actor's thread, prompts; the CPU acceleration (the
fast BLAS and the CPU kernels) is its own room, `native`.

Only this package imports MLX, and only after `mlxcel.model.native.blas.load_fast_blas()`.
Getting a model in place beforehand is `mlxcel.model.provision`'s job.
"""
