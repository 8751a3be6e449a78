"""The CPU acceleration: native code built for this machine and loaded once per process.

The fast BLAS (`blas`: OpenBLAS through a C shim, loaded before MLX), the CPU kernels as
one extension of MLX primitives (`kernels`: the quantized matmul `qmm*`, attention and
SwiGLU `attn*`, given to models by `qmm.py` and `cpu_forms.py`), and how both are built
(`build`).

Importing this package imports no MLX: `blas.load_fast_blas()` must run before `mlx.core`
is first imported.
"""
