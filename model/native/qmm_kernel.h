/*
 * CPU quantized matrix product for MLX's affine-quantized weights.
 *
 * Computes what mx.quantized_matmul(x, w, scales, biases, transpose=True,
 * group_size=group, bits=bits) computes on MLX's CPU backend (affine mode):
 *
 *   y[m][n] = sum_k x[m][k] * (scales[n][k/group] * q[n][k] + biases[n][k/group])
 *
 * Layouts (all row-major and CONTIGUOUS; strided or transposed inputs are the
 * caller's concern and must be copied to contiguous arrays first):
 *   x       float32 [m][k]
 *   w       uint32  [n][k*bits/32]  MLX's packing: each row is one little-endian
 *           bit stream, value j of the row at bit j*bits (for every bit width,
 *           including 3, 5 and 6, which MLX stores 8 values per `bits` bytes)
 *   scales  float32 [n][k/group]
 *   biases  float32 [n][k/group]
 *   y       float32 [m][n]          written, never read
 *
 * Supported: bits in {2, 3, 4, 5, 6, 8}, group in {32, 64, 128}, m >= 1,
 * n >= 1, k >= group and a multiple of group (each below 2^31).
 * Results equal MLX's to float32 rounding (the summation order differs; on
 * the AMX path a non-finite x may give NaN where MLX gives an infinity).
 *
 * Threads: the work is split over N on the process's one thread pool (pool.h:
 * workers spin briefly after a call, then sleep). Calls may come from several
 * threads at once: one runs on the pool, the others each on its own thread.
 * The weight buffer is never read past its last byte. On CPUs with AMX the
 * first call with several rows of x asks Linux for the tile state
 * (arch_prctl), once per process; MLXCEL_QMM_AMX=0 in the environment keeps
 * the tiles unused.
 */
#ifndef MLXCEL_QMM_KERNEL_H
#define MLXCEL_QMM_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 0 on success, nonzero for an unsupported bits/group pair (or
 * shape; y is untouched then) or when a thread had no memory for its scratch
 * (3; y is unspecified then). */
int mlxcel_qmm(const float *x, long m, long k, const uint32_t *w, const float *scales,
               const float *biases, long n, int bits, int group, float *y);

/* "avx512", "avx2" or "generic": the instruction set this build was compiled
 * for. The loader must check the CPU supports it before calling anything. */
const char *mlxcel_qmm_isa(void);

#ifdef __cplusplus
}
#endif

#endif /* MLXCEL_QMM_KERNEL_H */
